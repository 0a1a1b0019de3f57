"""The streaming job over secured connections, on the real secure servers (tests/fixtures_security.py):
Kafka over SASL_SSL and over mutual TLS, ClickHouse over TLS with a password user; and each wrong
Secret (password, CA, missing client certificate) stops the job with a clear message before it reads or
writes anything. Every run's output is checked for the test passwords.

The pipeline is examples/secure-sms-dedup.yaml itself, pointed at the local servers; its Secrets come
from `glasspipe run --secrets-dir` (the kubelet's part, see glasspipe_job/local_secrets.py).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fixtures_security import CLICKHOUSE_USER, KAFKA_USER, SecretValues
from glasspipe.contract import default_consumer_group
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka_secure import SecureKafkaServer
from glasspipe_dev.pipelines import (
    consume_all,
    dumps,
    group_lag,
    load_example,
    produce,
    run_argv,
    run_job,
    totals,
    write_pipeline,
)
from glasspipe_dev.tls import Pki

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("jvm_ops_jar", "spark_jars")]
T0 = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)


def sms(sms_id: str, status: str, at: datetime) -> tuple[bytes, bytes]:
    doc = {"sms_id": sms_id, "status": status, "phone": "+100", "meta": {"provider": "p"}, "sent_at": at.isoformat()}
    return sms_id.encode(), dumps(doc)


def write_secrets(directory: Path, values: dict[tuple[str, str], str]) -> Path:
    """DIR/<secret>/<key> files, as `glasspipe run --secrets-dir` (and a Secret volume) lays them out."""
    for (secret, key), value in values.items():
        (directory / secret).mkdir(parents=True, exist_ok=True)
        (directory / secret / key).write_text(value)
    return directory


def secrets_for(tmp_path: Path, pki: Pki, s: SecretValues, **override: str) -> Path:
    """The Secrets examples/secure-sms-dedup.yaml references (plus a client certificate), right unless overridden."""
    values = {
        ("sms-kafka-user", "username"): KAFKA_USER,
        ("sms-kafka-user", "password"): override.get("kafka_password", s.kafka_password),
        ("kafka-ca", "ca.crt"): override.get("kafka_ca", pki.ca_cert.read_text()),
        ("sms-kafka-client", "tls.crt"): pki.client.cert.read_text(),
        ("sms-kafka-client", "tls.key"): pki.client.key.read_text(),
        ("clickhouse-writer", "user"): CLICKHOUSE_USER,
        ("clickhouse-writer", "password"): override.get("clickhouse_password", s.clickhouse_password),
        ("clickhouse-ca", "ca.crt"): override.get("clickhouse_ca", pki.ca_cert.read_text()),
    }
    return write_secrets(tmp_path / f"secrets-{uuid.uuid4().hex[:6]}", values)


def secure_pipeline(tmp_path: Path, kafka: SecureKafkaServer, *, listener: str = "SASL_SSL",
                    client_cert: bool = True) -> tuple[Path, str, str]:
    """The secure example on fresh topics and a fresh table, for one listener of the secure broker: SASL_SSL
    (SCRAM-SHA-512, as in the example), SASL_PLAINTEXT (PLAIN) or MTLS (protocol SSL, client certificate)."""
    suffix = uuid.uuid4().hex[:8]
    topic, table = f"sec-sms-{suffix}", f"sec_sms_{suffix}"
    kafka.create_topic(topic, 2)
    kafka.create_topic(f"{topic}-dlq", 1)
    doc = load_example("secure-sms-dedup.yaml")
    doc["metadata"]["name"] = f"sec-{suffix}"
    spec = doc["spec"]
    spec["sources"][0]["kafka"]["topic"] = topic
    security: dict[str, Any] = spec["sources"][0]["kafka"]["security"]
    if listener == "MTLS":
        security.update(protocol="SSL")
        del security["sasl"]
        if client_cert:
            security["tls"].update(clientCertSecretRef={"name": "sms-kafka-client", "key": "tls.crt"},
                                   clientKeySecretRef={"name": "sms-kafka-client", "key": "tls.key"})
    elif listener == "SASL_PLAINTEXT":
        security.update(protocol="SASL_PLAINTEXT")
        security["sasl"]["mechanism"] = "PLAIN"
        del security["tls"]
    spec["sink"]["clickhouse"].update(table=table, batching={"maxRows": 50_000, "maxDelay": "1s"})
    spec["deadLetter"]["topic"] = f"{topic}-dlq"
    return write_pipeline(doc, tmp_path, f"{suffix}.yaml"), topic, table


def run(path: Path, kafka: SecureKafkaServer, ch: ClickHouseServer, listener: str, secrets: Path,
        checkpoint: Path) -> subprocess.CompletedProcess[str]:
    argv = run_argv(path, kafka.bootstrap_for(listener), f"127.0.0.1:{ch.secure_port}", checkpoint,
                    "--available-now", "--secrets-dir", str(secrets))
    started = time.monotonic()
    done = run_job(argv, timeout=600)
    print(f"glasspipe run over {listener}: exit {done.returncode} in {time.monotonic() - started:.1f} s")
    return done


def assert_no_secret(done: subprocess.CompletedProcess[str], s: SecretValues) -> None:
    for value in s.all:
        assert value not in done.stdout and value not in done.stderr, "a password was printed"


def assert_nothing_written(kafka: SecureKafkaServer, ch: ClickHouseServer, topic: str, table: str,
                           group: str) -> None:
    exists = ch.client().execute(f"EXISTS TABLE {table}")[0][0]
    assert not exists or ch.client().execute(f"SELECT count() FROM {table}")[0][0] == 0
    assert consume_all(kafka.bootstrap, f"{topic}-dlq", expected=0, timeout=2) == []
    assert all(committed < 0 for committed, _ in group_lag(kafka.bootstrap, group, topic).values())


def records(n: int, repeats: int) -> list[tuple[bytes, bytes]]:
    out = [sms(f"s-{i:05d}", "first", T0 + timedelta(milliseconds=10 * i)) for i in range(n)]
    out += [sms(f"s-{i:05d}", "repeat", T0 + timedelta(milliseconds=10 * i, seconds=30)) for i in range(repeats)]
    out.append((b"bad", b"{not json"))
    return out


@pytest.mark.parametrize("listener", ["SASL_SSL", "MTLS", "SASL_PLAINTEXT"])
def test_a_pipeline_over_tls_runs_exactly_as_on_plaintext(
    tmp_path: Path, secure_kafka: SecureKafkaServer, secure_clickhouse: ClickHouseServer, pki: Pki,
    test_secrets: SecretValues, listener: str
) -> None:
    """SASL_SSL with SCRAM-SHA-512 (or mutual TLS, or SASL_PLAINTEXT with PLAIN) to Kafka, TLS and a password
    to ClickHouse: the same rows,
    dead letters and committed offsets as the PLAINTEXT tests see; offsets, dead letters and the warm-up
    reads all use the secured librdkafka settings, the Kafka source the secured Java client."""
    path, topic, table = secure_pipeline(tmp_path, secure_kafka, listener=listener)
    produce(secure_kafka.bootstrap, topic, records(2000, 300))  # the tests' own PLAINTEXT listener
    done = run(path, secure_kafka, secure_clickhouse, listener, secrets_for(tmp_path, pki, test_secrets),
               tmp_path / "ckpt")
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert_no_secret(done, test_secrets)
    summary = totals(done.stdout)
    assert "records in 2301," in summary and "duplicates dropped 300," in summary, summary
    assert "dead-lettered 1 {" in summary and "rows written 2000," in summary, summary
    rows, distinct, repeats = secure_clickhouse.client().execute(
        f"SELECT count(), uniqExact(sms_id), countIf(status != 'first') FROM {table}")[0]
    assert (rows, distinct, repeats) == (2000, 2000, 0)
    [dead] = consume_all(secure_kafka.bootstrap, f"{topic}-dlq", expected=1)
    assert dead.value() == b"{not json"
    lag = group_lag(secure_kafka.bootstrap, default_consumer_group("default", f"sec-{path.stem}"), topic)
    assert len(lag) == 2 and all(c == end for c, end in lag.values()), lag


WRONG = {
    "kafka-password": ({"kafka_password": "not-the-password"}, "SASL_SSL", False,
                       f"SASL authentication failed for user '{KAFKA_USER}' on broker 127.0.0.1:"),
    "kafka-ca": ({"kafka_ca": "other"}, "SASL_SSL", False, "could not be verified"),
    "no-client-certificate": ({}, "MTLS", True, "refused the TLS client certificate (mutual TLS)"),
    "clickhouse-password": ({"clickhouse_password": "not-the-password"}, "SASL_SSL", False,
                            f"as user '{CLICKHOUSE_USER}' (TLS, spec.sink.clickhouse) failed: ServerException "
                            f"(code 193): Wrong password for user {CLICKHOUSE_USER}. Fix: wrong password: fix the "
                            "password in the Secret of spec.sink.clickhouse.passwordSecretRef"),
    "clickhouse-ca": ({"clickhouse_ca": "other"}, "SASL_SSL", False, "spec.sink.clickhouse.caSecretRef"),
}


@pytest.mark.parametrize("case", list(WRONG))
def test_a_wrong_secret_stops_the_job_with_a_clear_message_and_nothing_written(
    tmp_path: Path, secure_kafka: SecureKafkaServer, secure_clickhouse: ClickHouseServer, pki: Pki,
    test_secrets: SecretValues, case: str
) -> None:
    override, listener, no_cert, expected = WRONG[case]
    override = {k: pki.other_ca_cert.read_text() if v == "other" else v for k, v in override.items()}
    path, topic, table = secure_pipeline(tmp_path, secure_kafka, listener=listener, client_cert=not no_cert)
    produce(secure_kafka.bootstrap, topic, records(50, 0))
    started = time.monotonic()
    done = run(path, secure_kafka, secure_clickhouse, listener, secrets_for(tmp_path, pki, test_secrets, **override),
               tmp_path / "ckpt")
    elapsed = time.monotonic() - started
    assert done.returncode == 1, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    last = [ln for ln in done.stderr.splitlines() if ln.startswith("glasspipe: ")][-1]
    assert expected in last, last
    assert "Fix: " in last and "Secret" in last, last
    assert_no_secret(done, test_secrets)
    assert "SparkSession" not in done.stderr and elapsed < 60, f"{elapsed:.0f} s: the check comes before Spark"
    group = default_consumer_group("default", f"sec-{path.stem}")
    assert_nothing_written(secure_kafka, secure_clickhouse, topic, table, group)
