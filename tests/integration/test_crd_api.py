"""The GlassPipeline CRD on a real API server: examples accepted, bad resources refused with clear
messages (schema and CEL), immutable fields kept, the scale subresource works."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from glasspipe_dev.kube import KubeAPIServer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
NS = "crd-tests"
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def api(kube: KubeAPIServer) -> Iterator[KubeAPIServer]:
    kube.kubectl("apply", "--server-side", "-f", str(ROOT / "crds" / "glasspipe.io_glasspipelines.yaml"))
    kube.kubectl("wait", "--for=condition=Established", "crd/glasspipelines.glasspipe.io", "--timeout=60s")
    kube.kubectl("create", "namespace", NS, check=False)
    yield kube
    # leave no pipelines behind for the operator tests that share this API server
    kube.kubectl("delete", "gp", "--all", "-n", NS, "--wait=false", check=False)


def example(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / name).read_text())
    doc["metadata"]["namespace"] = NS
    return doc


def apply(api: KubeAPIServer, doc: dict[str, Any], *extra: str, check: bool = False) -> Any:
    return api.kubectl("apply", *extra, "-f", "-", input=json.dumps(doc), check=check)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted_and_defaulted(api: KubeAPIServer, path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["namespace"] = NS
    apply(api, doc, check=True)
    got = json.loads(api.kubectl("get", "gp", doc["metadata"]["name"], "-n", NS, "-o", "json").stdout)
    spec = got["spec"]
    # defaults from the schema are filled in by the API server
    assert spec["suspend"] is False
    assert spec["spark"]["shufflePartitions"] == 2
    given = doc["spec"]["sources"][0]["kafka"].get("security", {})
    assert spec["sources"][0]["kafka"]["security"] == {"protocol": "PLAINTEXT", **given}  # no tls: {} added
    assert spec["sink"]["clickhouse"]["batching"]["maxRows"] >= 1
    assert spec["sink"]["clickhouse"]["mutationTimeout"] == "15m"
    # No image default in the CRD: the operator's --spark-image applies to pipelines that name none.
    assert "image" not in spec["spark"]


def test_a_joins_sides_may_deduplicate_in_own_state(api: KubeAPIServer) -> None:
    """The API server takes deduplication.ownState on both sides of a join (it refused it before 2026-12-01)."""
    doc = example("dedup-then-join.yaml")
    doc["metadata"]["name"] = "join-own-state"
    for s in doc["spec"]["sources"]:
        s["deduplication"]["ownState"] = True
    apply(api, doc, check=True)
    got = json.loads(api.kubectl("get", "gp", "join-own-state", "-n", NS, "-o", "json").stdout)
    assert [s["deduplication"]["ownState"] for s in got["spec"]["sources"]] == [True, True]


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        node: Any = doc
        parts = path.split(".")
        for p in parts[:-1]:
            node = node[int(p)] if p.isdigit() else node.setdefault(p, {})
        last = parts[-1]
        if value is _DELETE:
            del node[last]
        elif last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value
    return mutate


_DELETE = object()

INVALID = [
    ("join-with-one-source", "orders-users-join.yaml", lambda d: d["spec"]["sources"].pop(),
     "a join needs exactly two sources"),
    ("dedup-key-undeclared", "sms-dedup.yaml", _set("spec.sources.0.deduplication.keys", ["nope"]),
     "deduplication.keys must name fields declared in schema.fields"),
    ("window-too-long", "sms-dedup.yaml", _set("spec.sources.0.deduplication.window", "40d"),
     "deduplication.window must be greater than 0 and at most 30d"),
    ("window-zero", "sms-dedup.yaml", _set("spec.sources.0.deduplication.window", "0s"),
     "deduplication.window must be greater than 0"),
    ("window-not-a-duration", "sms-dedup.yaml", _set("spec.sources.0.deduplication.window", "5 minutes"),
     "spec.sources[0].deduplication.window"),
    ("two-sources-no-join", "orders-users-join.yaml", _set("spec.join", _DELETE),
     "two sources need a join; one source needs none"),
    ("join-names-unknown-source", "orders-users-join.yaml", _set("spec.join.right.source", "profiles"),
     "join.left.source and join.right.source must name the two sources"),
    ("join-key-undeclared", "orders-users-join.yaml", _set("spec.join.right.keys", ["uid"]),
     "join.right.keys must name fields declared in the right source's schema"),
    ("join-keys-length", "orders-users-join.yaml", _set("spec.join.right.keys", ["user_id", "plan"]),
     "join.left.keys and join.right.keys must have the same length"),
    ("join-window-too-long", "orders-users-join.yaml", _set("spec.join.window", "8d"),
     "join.window must be greater than 0 and at most 7d"),
    ("sasl-without-credentials", "sms-dedup.yaml",
     _set("spec.sources.0.kafka.security", {"protocol": "SASL_SSL"}),
     "security.protocol SASL_PLAINTEXT and SASL_SSL need security.sasl (mechanism, usernameSecretRef, "
     "passwordSecretRef)"),
    ("sasl-without-password", "sms-dedup.yaml",
     _set("spec.sources.0.kafka.security", {"protocol": "SASL_SSL", "sasl": {
         "mechanism": "PLAIN", "usernameSecretRef": {"name": "u", "key": "username"}}}),
     "passwordSecretRef: Required value"),
    ("bad-sasl-mechanism", "sms-dedup.yaml",
     _set("spec.sources.0.kafka.security", {"protocol": "SASL_SSL", "sasl": {
         "mechanism": "GSSAPI", "usernameSecretRef": {"name": "u", "key": "username"},
         "passwordSecretRef": {"name": "u", "key": "password"}}}), "mechanism"),
    ("sasl-on-ssl", "sms-dedup.yaml",
     _set("spec.sources.0.kafka.security", {"protocol": "SSL", "sasl": {
         "mechanism": "PLAIN", "usernameSecretRef": {"name": "u", "key": "username"},
         "passwordSecretRef": {"name": "u", "key": "password"}}}),
     "security.sasl is only used with protocol SASL_PLAINTEXT or SASL_SSL"),
    ("tls-on-plaintext", "sms-dedup.yaml",
     _set("spec.sources.0.kafka.security", {"protocol": "PLAINTEXT", "tls": {"caSecretRef": {
         "name": "ca", "key": "ca.crt"}}}), "security.tls is only used with protocol SSL or SASL_SSL"),
    ("client-cert-without-key", "sms-dedup.yaml",
     _set("spec.sources.0.kafka.security", {"protocol": "SSL", "tls": {"clientCertSecretRef": {
         "name": "client", "key": "tls.crt"}}}),
     "tls.clientCertSecretRef and tls.clientKeySecretRef go together (mutual TLS): give both or neither"),
    ("inline-password", "sms-dedup.yaml",
     _set("spec.sink.clickhouse.password", "hunter2"), 'unknown field "spec.sink.clickhouse.password"'),
    ("clickhouse-ca-without-secure", "sms-dedup.yaml",
     _set("spec.sink.clickhouse.caSecretRef", {"name": "ch-ca", "key": "ca.crt"}),
     "sink.clickhouse.caSecretRef is only used with secure: true"),
    ("mutation-timeout-too-short", "sms-dedup.yaml", _set("spec.sink.clickhouse.mutationTimeout", "500ms"),
     "sink.clickhouse.mutationTimeout must be at least 1s and at most 24h (default 15m)"),
    ("mutation-timeout-too-long", "sms-dedup.yaml", _set("spec.sink.clickhouse.mutationTimeout", "2d"),
     "sink.clickhouse.mutationTimeout must be at least 1s and at most 24h (default 15m)"),
    ("mutation-timeout-not-a-duration", "sms-dedup.yaml", _set("spec.sink.clickhouse.mutationTimeout", "15 min"),
     "spec.sink.clickhouse.mutationTimeout"),
    ("bad-secret-name", "sms-dedup.yaml",
     _set("spec.sink.clickhouse.passwordSecretRef", {"name": "CH_Creds", "key": "password"}),
     "spec.sink.clickhouse.passwordSecretRef.name"),
    ("event-time-field-undeclared", "sms-dedup.yaml", _set("spec.sources.0.eventTime.field", "created"),
     "eventTime.field must name a field declared in schema.fields"),
    ("column-from-and-expression", "filter-mapping.yaml",
     _set("spec.sink.clickhouse.columns.1.from", "amount"), "give either from or expression, not both"),
    ("bad-clickhouse-type", "filter-mapping.yaml", _set("spec.sink.clickhouse.columns.0.type", "Strin"),
     "spec.sink.clickhouse.columns[0].type"),
    ("negative-replicas", "sms-dedup.yaml", _set("spec.replicas", -1), "spec.replicas"),
    ("empty-spark-image", "sms-dedup.yaml", _set("spec.spark.image", ""), "spec.spark.image"),
    ("missing-checkpoint", "sms-dedup.yaml", _set("spec.checkpoint", _DELETE), "checkpoint"),
    ("per-kafka-partition-in-a-join", "orders-users-join.yaml", _set("spec.sources.0.deduplication", {
        "keys": ["order_id"], "window": "5m", "perKafkaPartition": True}),
     "deduplication.perKafkaPartition is not for a joined source: remove it or the join"),
    ("duplicate-field-names", "sms-dedup.yaml",
     _set("spec.sources.0.schema.fields.1", {"name": "sms_id", "type": "long"}), "Duplicate value"),
]


@pytest.mark.parametrize(("name", "base", "mutate", "expected"), INVALID, ids=[i[0] for i in INVALID])
def test_invalid_resources_are_rejected_with_a_clear_message(
    api: KubeAPIServer, name: str, base: str, mutate: Callable[[dict[str, Any]], None], expected: str
) -> None:
    doc = example(base)
    doc["metadata"]["name"] = f"bad-{name}"
    mutate(doc)
    res = apply(api, doc)
    assert res.returncode != 0, f"{name} was accepted"
    assert expected in res.stderr, res.stderr
    assert api.kubectl("get", "gp", f"bad-{name}", "-n", NS, check=False).returncode != 0


IMMUTABLE = [
    ("dedup-keys", "sms-dedup.yaml", _set("spec.sources.0.deduplication.keys", ["sms_id", "status"]),
     "deduplication.keys is immutable"),
    ("checkpoint", "sms-dedup.yaml", _set("spec.checkpoint.location", "s3a://elsewhere/x"),
     "checkpoint.location is immutable"),
    ("shuffle-partitions", "sms-dedup.yaml", _set("spec.spark.shufflePartitions", 8),
     "spark.shufflePartitions is immutable"),
    ("join-removed", "orders-users-join.yaml", lambda d: (d["spec"].pop("join"), d["spec"]["sources"].pop()),
     "join cannot be added or removed"),
]


@pytest.mark.parametrize(("name", "base", "mutate", "expected"), IMMUTABLE, ids=[i[0] for i in IMMUTABLE])
def test_immutable_fields_cannot_change(
    api: KubeAPIServer, name: str, base: str, mutate: Callable[[dict[str, Any]], None], expected: str
) -> None:
    doc = example(base)
    doc["metadata"]["name"] = f"imm-{name}"
    apply(api, doc, check=True)
    changed = copy.deepcopy(doc)
    mutate(changed)
    res = apply(api, changed)
    assert res.returncode != 0 and expected in res.stderr, res.stderr
    # a mutable field still changes
    ok = copy.deepcopy(doc)
    ok["spec"]["spark"] = {"image": "glasspipe/spark:0.2.0"}
    apply(api, ok, check=True)


def test_kubectl_scale_sets_spec_replicas(api: KubeAPIServer) -> None:
    doc = example("sms-dedup.yaml")
    doc["metadata"]["name"] = "scale-me"
    apply(api, doc, check=True)
    api.kubectl("scale", "gp/scale-me", "-n", NS, "--replicas=3")
    got = json.loads(api.kubectl("get", "gp", "scale-me", "-n", NS, "-o", "json").stdout)
    assert got["spec"]["replicas"] == 3
    scale = json.loads(api.kubectl("get", "--raw",
                                   f"/apis/glasspipe.io/v1alpha1/namespaces/{NS}/glasspipelines/scale-me/scale").stdout)
    assert scale["spec"]["replicas"] == 3 and scale["kind"] == "Scale"


def test_printer_columns(api: KubeAPIServer) -> None:
    out = api.kubectl("get", "gp", "-n", NS).stdout.splitlines()[0].split()
    assert out[:7] == ["NAME", "READY", "REPLICAS", "RUNNING", "LAG", "TOPICS", "AGE"]
