"""The operator-job contract: what the render writes is what the job reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from glasspipe import contract
from glasspipe.api.validation import validate_resource, validate_spec
from glasspipe.render import render_spark_applications
from glasspipe_job.config import load_job_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.unit


def tls_doc() -> dict[str, Any]:
    """sms-dedup with TLS to ClickHouse and Kafka, each with its own CA Secret."""
    doc = yaml.safe_load((ROOT / "examples" / "sms-dedup.yaml").read_text())
    doc["spec"]["sink"]["clickhouse"].update(secure=True, caSecretRef={"name": "ch-ca", "key": "ca.crt"})
    doc["spec"]["sources"][0]["kafka"]["security"] = {
        "protocol": "SSL", "caSecretRef": {"name": "kafka-ca", "key": "root.pem"}}
    return doc


def mounted_files(app: dict[str, Any], container: str = "driver") -> dict[str, str]:
    """Secret name -> the path at which the container sees its key, read from the rendered pod template."""
    pod = app["spec"][container]["template"]["spec"]
    by_volume = {v["name"]: (v["secret"]["secretName"], v["secret"]["items"][0]["path"]) for v in pod["volumes"]}
    out = {}
    for mount in pod["containers"][0]["volumeMounts"]:
        secret, path = by_volume[mount["name"]]
        out[secret] = f"{mount['mountPath']}/{path}"
    return out


def rendered() -> tuple[dict[str, str], Any]:
    [app] = render_spark_applications("ns", "sms", "uid", validate_resource(tls_doc())[0])
    args = app["spec"]["arguments"]
    config = load_job_config(args[args.index("--config-json") + 1])
    assert mounted_files(app) == mounted_files(app, "executor")
    return mounted_files(app), config


def test_the_rendered_clickhouse_ca_reaches_the_sink() -> None:
    from glasspipe_job.runner import make_sink

    files, config = rendered()
    sink = make_sink(config)
    assert sink.secure is True
    assert sink.ca_file == files["ch-ca"] == "/etc/glasspipe/ca/clickhouse-ca/ca.crt"


def test_the_rendered_kafka_ca_reaches_spark_and_librdkafka() -> None:
    files, config = rendered()
    [source] = config.spec.sources
    spark = config.kafka_options(source)
    assert spark["kafka.ssl.truststore.location"] == files["kafka-ca"]
    assert spark["kafka.ssl.truststore.type"] == "PEM"
    # offset commits, the dead-letter producer and the warm-up consumer all use these
    rdkafka = config.librdkafka_options(source)
    assert rdkafka["security.protocol"] == "SSL"
    assert rdkafka["ssl.ca.location"] == files["kafka-ca"]


def test_the_job_reads_secret_values_from_the_env_vars_the_render_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tls_doc()
    doc["spec"]["sink"]["clickhouse"]["credentialsSecretRef"] = {"name": "ch-creds"}
    doc["spec"]["sources"][0]["kafka"]["security"].update(
        protocol="SASL_SSL", saslMechanism="SCRAM-SHA-256", credentialsSecretRef={"name": "kafka-creds"})
    [app] = render_spark_applications("ns", "sms", "uid", validate_resource(doc)[0])
    for e in app["spec"]["driver"]["template"]["spec"]["containers"][0]["env"]:
        ref = e["valueFrom"]["secretKeyRef"]
        monkeypatch.setenv(e["name"], f"{ref['name']}/{ref['key']}")  # what the kubelet would put there
    config = load_job_config(app["spec"]["arguments"][1])
    assert config.clickhouse_credentials == ("ch-creds/username", "ch-creds/password")
    rdkafka = config.librdkafka_options(config.spec.sources[0])
    assert (rdkafka["sasl.mechanism"], rdkafka["sasl.username"], rdkafka["sasl.password"]) == (
        "SCRAM-SHA-256", "kafka-creds/username", "kafka-creds/password")
    assert 'username="kafka-creds/username"' in config.kafka_options(config.spec.sources[0])["kafka.sasl.jaas.config"]


def test_the_render_passes_the_spark_settings_the_job_builds_its_session_with() -> None:
    doc = tls_doc()
    doc["spec"]["spark"] = {"conf": {"spark.sql.shuffle.partitions": "9", "spark.x": "y"}}
    [app] = render_spark_applications("ns", "sms", "uid", validate_resource(doc)[0])
    config = load_job_config(app["spec"]["arguments"][1])
    assert config.spark_conf.items() <= app["spec"]["sparkConf"].items()
    assert config.spark_conf["spark.sql.shuffle.partitions"] == "9"  # the user's word wins
    assert set(contract.REQUIRED_SPARK_CONF) <= set(config.spark_conf)


def test_job_config_writer_and_reader_round_trip() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "orders-users-join.yaml").read_text())
    doc["spec"].update(replicas=3, suspend=False)
    spec, _ = validate_resource(doc)
    written = contract.write_job_config("team-a", "orders", spec, 2)
    read = contract.read_job_config(contract.job_config_json(written))
    assert read == contract.read_job_config(written)
    assert (read.namespace, read.pipeline, read.replica, read.replicas) == ("team-a", "orders", 2, 3)
    assert not contract.OPERATOR_ONLY_FIELDS & set(read.spec)
    respec, _ = validate_spec(read.spec)
    assert respec.model_dump(exclude=set(contract.OPERATOR_ONLY_FIELDS)) == spec.model_dump(
        exclude=set(contract.OPERATOR_ONLY_FIELDS))
    # ``glasspipe run --replicas`` overrides the spec's count; the job config carries it, the spec stays as is
    assert contract.read_job_config(contract.write_job_config("ns", "p", spec, 0, replicas=5)).replicas == 5
    config = load_job_config(contract.job_config_json(written))
    assert (config.replica, config.replicas, config.checkpoint_dir.rsplit("/", 1)[1]) == (2, 3, "replica-2-of-3")


def test_the_job_config_json_is_byte_stable() -> None:
    spec, _ = validate_resource(tls_doc())
    one = contract.job_config_json(contract.write_job_config("ns", "p", spec, 0))
    assert one == contract.job_config_json(contract.write_job_config("ns", "p", spec.model_copy(deep=True), 0))
    assert one.startswith('{"namespace":"ns","pipeline":"p","replica":0,"replicas":1,"spec":{')
