"""The operator-job contract: what the render writes is what the job reads."""

from __future__ import annotations

import re
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
        "protocol": "SSL", "tls": {"caSecretRef": {"name": "kafka-ca", "key": "root.pem"}}}
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
    from glasspipe_job.runner import make_table

    files, config = rendered()
    connection = make_table(config).connection  # the sink writes through its table's connection
    assert connection.secure is True
    assert connection.ca_file == files["ch-ca"] == "/etc/glasspipe/secrets/clickhouse-ca/ca.crt"


def test_the_rendered_kafka_ca_reaches_spark_and_librdkafka() -> None:
    files, config = rendered()
    [source] = config.spec.sources
    spark = config.kafka_options(source)
    assert spark["kafka.ssl.truststore.location"] == files["kafka-ca"]
    assert spark["kafka.ssl.truststore.type"] == "PEM"
    # a cached consumer's parked fetch must not hold the next micro-batch's Kafka task for Kafka's 500 ms
    assert int(spark["kafka.fetch.max.wait.ms"]) <= 100
    # Spark's reader asks the broker for the offset range after every poll: a poll must take a whole fetch
    # (1 MiB a partition, ~4 500 records of 200 bytes), not Kafka's default 500 records of it
    assert int(spark["kafka.max.poll.records"]) >= 5_000
    # offset commits, the dead-letter producer and the warm-up consumer all use these
    rdkafka = config.librdkafka_options(source)
    assert rdkafka["security.protocol"] == "SSL"
    assert rdkafka["ssl.ca.location"] == files["kafka-ca"]


def sasl_mtls_doc() -> dict[str, Any]:
    """tls_doc with SASL_SSL, a client certificate and a ClickHouse password user."""
    doc = tls_doc()
    doc["spec"]["sink"]["clickhouse"].update(userSecretRef={"name": "ch-creds", "key": "user"},
                                             passwordSecretRef={"name": "ch-creds", "key": "password"})
    doc["spec"]["sources"][0]["kafka"]["security"].update(protocol="SASL_SSL", sasl={
        "mechanism": "SCRAM-SHA-256", "usernameSecretRef": {"name": "kafka-creds", "key": "username"},
        "passwordSecretRef": {"name": "kafka-creds", "key": "password"}})
    doc["spec"]["sources"][0]["kafka"]["security"]["tls"].update(
        clientCertSecretRef={"name": "kafka-client", "key": "tls.crt"},
        clientKeySecretRef={"name": "kafka-client", "key": "tls.key"})
    return doc


def test_the_job_reads_secret_values_from_the_env_vars_the_render_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    [app] = render_spark_applications("ns", "sms", "uid", validate_resource(sasl_mtls_doc())[0])
    for e in app["spec"]["driver"]["template"]["spec"]["containers"][0]["env"]:
        ref = e["valueFrom"]["secretKeyRef"]
        monkeypatch.setenv(e["name"], f"{ref['name']}/{ref['key']}")  # what the kubelet would put there
    config = load_job_config(app["spec"]["arguments"][1])
    assert config.clickhouse_credentials == ("ch-creds/user", "ch-creds/password")
    rdkafka = config.librdkafka_options(config.spec.sources[0])
    assert (rdkafka["sasl.mechanism"], rdkafka["sasl.username"], rdkafka["sasl.password"]) == (
        "SCRAM-SHA-256", "kafka-creds/username", "kafka-creds/password")
    assert sorted(config.secret_values()) == ["ch-creds/password", "kafka-creds/password"]


def test_the_rendered_client_certificate_reaches_spark_and_librdkafka(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutual TLS: librdkafka reads the mounted files; Spark's Java client gets the PEM text inline (its PEM
    key store wants key and chain in one file, the mounts hold them apart)."""
    [app] = render_spark_applications("ns", "sms", "uid", validate_resource(sasl_mtls_doc())[0])
    files = mounted_files(app)
    assert files["kafka-client"].startswith(contract.SECRET_FILES_DIR)
    # play the kubelet under another root, as glasspipe run and the e2e stand-in do
    pod = app["spec"]["driver"]["template"]["spec"]
    items = {v["name"]: v["secret"] for v in pod["volumes"]}
    for mount in pod["containers"][0]["volumeMounts"]:
        secret = items[mount["name"]]
        local = tmp_path / mount["mountPath"].removeprefix(contract.SECRET_FILES_DIR + "/") / secret["items"][0]["path"]
        local.parent.mkdir(parents=True)
        local.write_text("-----BEGIN PRIVATE KEY-----\nkey\n" if local.name == "tls.key" else f"{local.name}\n")
    monkeypatch.setenv(contract.ENV_SECRET_FILES_DIR, str(tmp_path))
    config = load_job_config(app["spec"]["arguments"][1])
    [source] = config.spec.sources
    rdkafka = config.librdkafka_options(source)
    assert rdkafka["ssl.certificate.location"] == f"{tmp_path}/kafka-sms-client-cert/tls.crt"
    assert rdkafka["ssl.key.location"] == f"{tmp_path}/kafka-sms-client-key/tls.key"
    assert rdkafka["ssl.ca.location"] == f"{tmp_path}/kafka-sms-ca/root.pem"
    spark = config.kafka_options(source)
    assert spark["kafka.ssl.keystore.type"] == "PEM"
    assert spark["kafka.ssl.keystore.certificate.chain"] == "tls.crt\n"
    assert spark["kafka.ssl.keystore.key"].startswith("-----BEGIN PRIVATE KEY-----")
    redaction = re.compile(contract.SPARK_REDACTION_REGEX)
    assert redaction.search("kafka.ssl.keystore.key") and redaction.search("kafka.sasl.jaas.config")


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


def test_the_mutation_timeout_reaches_the_sink_s_connection() -> None:
    """sink.clickhouse.mutationTimeout: spec -> render -> job config -> the table's connection deadline."""
    from glasspipe_job.clickhouse.mutations import DEFAULT_MUTATION_DEADLINE
    from glasspipe_job.runner import make_table

    doc = yaml.safe_load((ROOT / "examples" / "sms-dedup.yaml").read_text())
    for value, seconds in ((None, DEFAULT_MUTATION_DEADLINE), ("90s", 90.0), ("2h", 7200.0), ("1500ms", 1.5)):
        if value is not None:
            doc["spec"]["sink"]["clickhouse"]["mutationTimeout"] = value
        [app] = render_spark_applications("ns", "sms", "uid", validate_resource(doc)[0])
        args = app["spec"]["arguments"]
        raw = args[args.index(contract.CONFIG_ARGUMENT) + 1]
        assert contract.read_job_config(raw).spec["sink"]["clickhouse"]["mutationTimeout"] == (value or "15m")
        config = load_job_config(raw)
        assert config.mutation_deadline == seconds
        table = make_table(config)
        assert table.connection.mutation_deadline == table.mutation_watch("x").deadline == seconds


def test_the_job_config_json_is_byte_stable() -> None:
    spec, _ = validate_resource(tls_doc())
    one = contract.job_config_json(contract.write_job_config("ns", "p", spec, 0))
    assert one == contract.job_config_json(contract.write_job_config("ns", "p", spec.model_copy(deep=True), 0))
    assert one.startswith('{"namespace":"ns","pipeline":"p","replica":0,"replicas":1,"spec":{')


def snapshot_batches(max_delay: str, spark_conf: dict[str, str]) -> str:
    """The snapshot interval the job gets for sms-dedup with this micro-batch interval and spec.spark.conf."""
    doc = yaml.safe_load((ROOT / "examples" / "sms-dedup.yaml").read_text())
    doc["spec"]["sink"]["clickhouse"]["batching"] = {"maxDelay": max_delay}
    doc["spec"]["spark"] = {"conf": spark_conf}
    return contract.spark_conf(validate_resource(doc)[0])[contract.SNAPSHOT_BATCHES_CONF]


@pytest.mark.parametrize(("max_delay", "batches"), [("250ms", 240), ("1s", 60), ("5s", 12), ("7s", 10), ("1m", 10)])
def test_the_state_store_snapshots_about_once_a_maintenance_interval(max_delay: str, batches: int) -> None:
    assert snapshot_batches(max_delay, {}) == str(batches)
    assert snapshot_batches(max_delay, {contract.SNAPSHOT_BATCHES_CONF: "25"}) == "25"  # the user's


@pytest.mark.parametrize(("interval", "batches"), [("120000", 120), ("2m", 120), ("10s", 10), ("2min", 60)])
def test_the_snapshot_interval_follows_a_maintenance_interval_the_user_sets(interval: str, batches: int) -> None:
    # 2min: a form glasspipe does not read, so Spark's 60 s
    assert snapshot_batches("1s", {contract.MAINTENANCE_INTERVAL_CONF: interval}) == str(batches)


def test_a_local_run_puts_the_drivers_java_tmpdir_after_the_required_java_options() -> None:
    """A local run's Spark scratch follows TMPDIR (Java itself ignores it); the job's required G1 option stays."""
    from glasspipe_job.config import config_from_resource
    from glasspipe_job.session import with_temp_dir

    doc = yaml.safe_load((ROOT / "examples" / "sms-dedup.yaml").read_text())
    conf = load_job_config(config_from_resource(doc)).spark_conf
    got = with_temp_dir(conf, "/tmp/gp tmp-1")
    options = f"{contract.G1_REGION_OPTION} -Djava.io.tmpdir='/tmp/gp tmp-1'"
    assert got[contract.DRIVER_DEFAULT_JAVA_OPTIONS_CONF] == options
    assert {k: v for k, v in got.items() if k != contract.DRIVER_DEFAULT_JAVA_OPTIONS_CONF} == {
        k: v for k, v in conf.items() if k != contract.DRIVER_DEFAULT_JAVA_OPTIONS_CONF}
    assert with_temp_dir({}, "/tmp")[contract.DRIVER_DEFAULT_JAVA_OPTIONS_CONF] == "-Djava.io.tmpdir=/tmp"
