"""The operator and Secrets, against a real kube-apiserver under the chart's RBAC (no Spark: the test plays
spark-operator and the kubelet): what it renders references Secrets and never holds a value, it cannot
read Secrets at all, and a failed driver's own words (its termination message) reach Degraded."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from glasspipe_dev.kube import KubeAPIServer
from glasspipe_dev.pipelines import load_example
from operator_harness import Operator, running_operator

pytestmark = pytest.mark.integration

PASSWORDS = {"kafka": "kafka-pw-never-rendered-5f1c", "clickhouse": "ch-pw-never-rendered-9e2a"}


@pytest.fixture(scope="module")
def operator(kube: KubeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    with running_operator(kube, tmp_path_factory.mktemp("operator") / "operator.log") as op:
        yield op


def create_secrets(op: Operator, ns: str) -> None:
    for name, data in {
        "sms-kafka-user": {"username": "svc-sms", "password": PASSWORDS["kafka"]},
        "kafka-ca": {"ca.crt": "-----BEGIN CERTIFICATE-----\nnot checked by the operator\n"},
        "clickhouse-writer": {"user": "writer", "password": PASSWORDS["clickhouse"]},
        "clickhouse-ca": {"ca.crt": "-----BEGIN CERTIFICATE-----\nnot checked either\n"},
    }.items():
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns},
                  "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
        op.k("apply", "-f", "-", input=json.dumps(secret))


def secure_pipeline(op: Operator, ns: str, name: str = "sec") -> dict[str, Any]:
    doc = load_example("secure-sms-dedup.yaml")
    doc["metadata"] = {"name": name, "namespace": ns}
    op.k("apply", "-f", "-", input=json.dumps(doc))
    return doc


def test_applications_reference_secrets_and_the_operator_cannot_read_them(operator: Operator) -> None:
    op = operator
    ns = op.new_namespace()
    create_secrets(op, ns)
    secure_pipeline(op, ns)
    [app] = op.wait_apps(ns, ["sec-0"]).values()
    op.wait_condition(ns, "sec", "Progressing", "True")
    # everything the operator wrote to the API server: applications, the pipeline's status, events
    written = [op.k("get", kind, "-n", ns, "-o", "json") for kind in ("sparkapplications", "glasspipelines", "events")]
    for text in written:
        assert not any(p in text for p in PASSWORDS.values())
    for role in ("driver", "executor"):
        pod = app["spec"][role]["template"]["spec"]
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["GLASSPIPE_KAFKA_SMS_PASSWORD"] == {
            "name": "GLASSPIPE_KAFKA_SMS_PASSWORD",
            "valueFrom": {"secretKeyRef": {"name": "sms-kafka-user", "key": "password"}}}
        assert env["GLASSPIPE_CLICKHOUSE_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": "clickhouse-writer", "key": "password"}
        assert sorted(v["secret"]["secretName"] for v in pod["volumes"]) == ["clickhouse-ca", "kafka-ca"]
    # Least privilege: the operator's ServiceAccount may not read (or list, or watch) any Secret.
    for verb in ("get", "list", "watch"):
        res = op.kube.kubectl("--kubeconfig", str(op.kubeconfig), "auth", "can-i", verb, "secrets", "-n", ns,
                              check=False)
        assert res.stdout.strip() == "no", (verb, res.stdout, res.stderr)


def test_a_failed_driver_s_termination_message_reaches_degraded(operator: Operator) -> None:
    """spark-operator's errorMessage only has the exit code; the job's reason is in the driver pod's
    container status (terminated.message, from /dev/termination-log)."""
    op = operator
    ns = op.new_namespace()
    create_secrets(op, ns)
    secure_pipeline(op, ns)
    [app] = op.wait_apps(ns, ["sec-0"]).values()
    reason = ("SASL authentication failed for user 'svc-sms' on broker kafka-0.kafka:9093 (source sms, mechanism "
              "SCRAM-SHA-512): SASL authentication error: Authentication failed during authentication due to "
              "invalid credentials with SASL mechanism SCRAM-SHA-512. Fix: the user name and password in the "
              "Secrets of spec.sources[0].kafka.security.sasl.usernameSecretRef and ...passwordSecretRef")
    # the kubelet's part: the driver pod spark-operator made, its container terminated with the job's message
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "sec-0-driver", "namespace": ns,
                        "labels": {**app["spec"]["driver"]["labels"], "spark-role": "driver",
                                   "sparkoperator.k8s.io/app-name": "sec-0"},
                        "ownerReferences": [{"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
                                             "name": "sec-0", "uid": app["metadata"]["uid"]}]},
           "spec": {"nodeName": "nowhere", "containers": [{"name": "spark-kubernetes-driver", "image": "spark"}]}}
    op.k("apply", "-f", "-", input=json.dumps(pod))
    status = {"status": {"phase": "Failed", "containerStatuses": [{
        "name": "spark-kubernetes-driver", "ready": False, "restartCount": 0, "image": "spark", "imageID": "",
        "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": reason}}}]}}
    op.k("patch", "pod", "sec-0-driver", "-n", ns, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    op.set_state(ns, "sec-0", "FAILING", "driver container failed with ExitCode: 1, Reason: Error")
    deg = op.wait_condition(ns, "sec", "Degraded", "True", "ReplicaFailed")
    assert deg["message"] == f"replica sec-0 is FAILING: {reason} (driver container failed with ExitCode: 1, " \
                             "Reason: Error)"
    replica = op.pipeline(ns, "sec")["status"]["replicaStatuses"][0]
    assert replica["message"].startswith("SASL authentication failed for user 'svc-sms'")
    events = json.loads(op.k("get", "events", "-n", ns, "-o", "json"))["items"]
    assert any(reason in (e.get("message") or "") for e in events), [e.get("message") for e in events]
    # the rerun starts: Degraded clears
    op.set_state(ns, "sec-0", "RUNNING")
    op.wait_condition(ns, "sec", "Degraded", "False")
