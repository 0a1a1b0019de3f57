"""Errors about connections and credentials: which kind of failure, worded with the field to fix, and no
secret value anywhere (pure: no servers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from glasspipe import conditions as cond
from glasspipe import contract
from glasspipe.api.validation import validate_resource
from glasspipe_job import failure
from glasspipe_job.config import jaas_quote
from glasspipe_job.connections import KafkaTarget, Problem, classify, describe_kafka_error
from glasspipe_job.local_secrets import LocalSecretMissing, load_local_secrets

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.unit

TARGET = KafkaTarget("source sms", "k1:9093,k2:9093", "SASL_SSL", "SCRAM-SHA-512", "svc-sms", "spec.sources[0].kafka")

# librdkafka's own words, as the security smoke tests saw them
AUTH = ("sasl_ssl://10.0.0.7:9093/bootstrap: SASL authentication error: Authentication failed during authentication "
        "due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 302ms in state AUTH_REQ)")
CA = ("sasl_ssl://10.0.0.7:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify "
      "failed: broker certificate could not be verified, verify that ssl.ca.location is correctly configured or "
      "root CA certificates are installed (install ca-certificates package) (after 5ms in state SSL_HANDSHAKE)")
NO_CERT = ("ssl://10.0.0.7:9094/bootstrap: Receive failed: error:0A000412:SSL routines::ssl/tls alert bad "
           "certificate: SSL alert number 42 (after 1ms in state APIVERSION_QUERY)")
MECH = ("sasl_ssl://10.0.0.7:9094/bootstrap: SASL PLAIN mechanism handshake failed: Broker: Request not valid in "
        "current SASL state: broker's supported mechanisms:  (after 1ms in state AUTH_HANDSHAKE)")


@pytest.mark.parametrize(("code", "text", "problem"), [
    ("_AUTHENTICATION", AUTH, Problem.AUTHENTICATION),
    ("_SSL", CA, Problem.SERVER_CERTIFICATE),
    ("_TRANSPORT", CA.replace("SSL handshake failed: ", ""), Problem.SERVER_CERTIFICATE),
    ("_TRANSPORT", NO_CERT, Problem.CLIENT_CERTIFICATE),
    ("_AUTHENTICATION", MECH, Problem.MECHANISM),
    ("_TRANSPORT", "ipv4#10.0.0.7:9093 failed: Connection refused", Problem.UNREACHABLE),
    ("_ALL_BROKERS_DOWN", "1/1 brokers are down", None),
])
def test_librdkafka_errors_are_classified(code: str, text: str, problem: Problem | None) -> None:
    assert classify(code, text) is problem


def test_messages_name_user_broker_and_the_field_to_fix() -> None:
    auth = describe_kafka_error(Problem.AUTHENTICATION, AUTH, TARGET)
    assert auth.startswith("SASL authentication failed for user 'svc-sms' on broker 10.0.0.7:9093 (source sms, "
                           "mechanism SCRAM-SHA-512)")
    assert "spec.sources[0].kafka.security.sasl.passwordSecretRef" in auth and "after 302ms" not in auth
    ca = describe_kafka_error(Problem.SERVER_CERTIFICATE, CA, TARGET)
    assert ca.startswith("TLS: the certificate of broker 10.0.0.7:9093 (source sms) could not be verified")
    assert "spec.sources[0].kafka.security.tls.caSecretRef" in ca
    cert = describe_kafka_error(Problem.CLIENT_CERTIFICATE, NO_CERT, TARGET)
    assert "refused the TLS client certificate (mutual TLS)" in cert and "clientCertSecretRef" in cert
    down = describe_kafka_error(Problem.UNREACHABLE, "Failed to get metadata: Local: Broker transport failure", TARGET)
    assert down.startswith("cannot reach Kafka k1:9093,k2:9093 (source sms) over SASL_SSL")


def test_redact_takes_out_every_secret_and_its_jaas_form() -> None:
    pw = 'p"w\\x-1'
    text = f'jaas: password="{jaas_quote(pw)}"; raw {pw}; other pw2-secret and pw2-secret-longer'
    out = failure.redact(text, [pw, "pw2-secret", "pw2-secret-longer", ""])
    assert pw not in out and jaas_quote(pw) not in out and "pw2-secret" not in out
    assert out.count(failure.REDACTED) == 4


def test_report_writes_the_redacted_line_to_stderr_and_the_termination_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "termination-log"
    monkeypatch.setenv(contract.ENV_TERMINATION_LOG, str(log))
    failure.report("SASL authentication failed for user 'u' (password hunter2 echoed back)", ["hunter2"])
    assert capsys.readouterr().err == f"glasspipe: SASL authentication failed for user 'u' (password " \
                                      f"{failure.REDACTED} echoed back)\n"
    assert "hunter2" not in log.read_text() and log.read_text().startswith("SASL authentication failed")
    failure.report("x" * 10_000, [])
    assert len(log.read_bytes()) == failure.MAX_TERMINATION_MESSAGE


def test_java_kafka_failures_are_explained() -> None:
    class StreamingQueryException(Exception):
        pass

    e = StreamingQueryException("[STREAM_FAILED] Query terminated with exception\n"
                                "org.apache.kafka.common.errors.SaslAuthenticationException: Authentication failed "
                                "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512")
    assert failure.explain(e).startswith("SASL authentication to Kafka failed in Spark's Kafka connector: ")
    assert failure.explain(RuntimeError("boom\nstack")) == "RuntimeError: boom"


def secure_doc() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "secure-sms-dedup.yaml").read_text())
    doc["spec"]["sources"][0]["kafka"]["security"]["tls"].update(
        clientCertSecretRef={"name": "sms-kafka-client", "key": "tls.crt"},
        clientKeySecretRef={"name": "sms-kafka-client", "key": "tls.key"})
    return doc


def test_local_secrets_are_laid_out_as_the_kubelet_would(tmp_path: Path) -> None:
    spec, _ = validate_resource(secure_doc())
    secrets = tmp_path / "secrets"
    for name, key, value in [("sms-kafka-user", "username", "svc-sms\n"), ("sms-kafka-user", "password", "k-pw"),
                             ("kafka-ca", "ca.crt", "CA1"), ("sms-kafka-client", "tls.crt", "CERT"),
                             ("sms-kafka-client", "tls.key", "KEY"), ("clickhouse-writer", "user", "w"),
                             ("clickhouse-writer", "password", "c-pw"), ("clickhouse-ca", "ca.crt", "CA2")]:
        (secrets / name).mkdir(parents=True, exist_ok=True)
        (secrets / name / key).write_text(value)
    env: dict[str, str] = {}
    root = load_local_secrets(spec, secrets, env)
    assert root is not None and env[contract.ENV_SECRET_FILES_DIR] == str(root)
    assert env[contract.kafka_env("sms", "username")] == "svc-sms"  # a trailing newline is not part of it
    assert (env[contract.ENV_CLICKHOUSE_USER], env[contract.ENV_CLICKHOUSE_PASSWORD]) == ("w", "c-pw")
    assert (root / "kafka-sms-client-key" / "tls.key").read_text() == "KEY"
    assert oct((root / "kafka-sms-client-key" / "tls.key").stat().st_mode & 0o777) == "0o600"
    (secrets / "kafka-ca" / "ca.crt").unlink()
    with pytest.raises(LocalSecretMissing, match=r"spec.sources\[0\].kafka.security.tls.caSecretRef references key "
                                                 r"'ca.crt' of Secret 'kafka-ca'"):
        load_local_secrets(spec, secrets, {})


def pod(app_uid: str, message: str | None, *, last: bool = False) -> dict[str, Any]:
    terminated = {"exitCode": 1, "reason": "Error", **({"message": message} if message else {})}
    return {"metadata": {"ownerReferences": [{"kind": "SparkApplication", "uid": app_uid}]},
            "status": {"containerStatuses": [{"name": "spark-kubernetes-driver",
                                              ("lastState" if last else "state"): {"terminated": terminated}}]}}


def test_a_failed_driver_s_own_words_lead_the_degraded_message() -> None:
    messages = cond.termination_messages([pod("u1", "SASL authentication failed for user 'u' on broker b:9093"),
                                          pod("u2", None), pod("u3", "earlier run", last=True)])
    assert messages == {"u1": "SASL authentication failed for user 'u' on broker b:9093", "u3": "earlier run"}
    app = {"metadata": {"name": "p-0", "uid": "u1"},
           "status": {"applicationState": {"state": "FAILING",
                                           "errorMessage": "driver container failed with ExitCode: 1, Reason: Error"}}}
    a = cond.assess(1, [cond.observe_app(app, 0, True, messages)])
    degraded = next(c for c in a.conditions if c.type == cond.DEGRADED)
    assert degraded.message == ("replica p-0 is FAILING: SASL authentication failed for user 'u' on broker b:9093 "
                                "(driver container failed with ExitCode: 1, Reason: Error)")
    assert a.replica_statuses[0]["message"].startswith("SASL authentication failed")


def test_a_driver_whose_jvm_is_gone_says_so() -> None:
    """A `glasspipe run` whose JVM was SIGKILLed ended on py4j's reconnect: `ConnectionRefusedError` raised while
    handling its `Py4JNetworkError`. The line says the JVM is gone, not only that a connection was refused."""
    from py4j.protocol import Py4JNetworkError

    with pytest.raises(ConnectionRefusedError) as refused:
        try:
            raise Py4JNetworkError("Answer from Java side is empty")
        except Py4JNetworkError:
            raise ConnectionRefusedError(111, "Connection refused")  # noqa: B904 (py4j's own shape: a context)
    line = failure.explain(refused.value)
    assert line.startswith("the driver's Spark JVM is gone (ConnectionRefusedError: [Errno 111] Connection refused)")
    assert "spec.spark.driver.memory" in line
    assert failure.explain(Py4JNetworkError("Error while sending")).startswith("the driver's Spark JVM is gone")
    # a refused connection that is not py4j's stays as it was
    assert failure.explain(ConnectionRefusedError(111, "Connection refused")) == \
        "ConnectionRefusedError: [Errno 111] Connection refused"
    with pytest.raises(ConnectionRefusedError) as elsewhere:
        try:
            raise ValueError("not py4j")
        except ValueError:
            raise ConnectionRefusedError(111, "Connection refused")  # noqa: B904
    assert not failure.explain(elsewhere.value).startswith("the driver's Spark JVM is gone")
