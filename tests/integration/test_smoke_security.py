"""The secure test servers from dev/ accept the right credentials over each secured listener and refuse
wrong passwords, an unrelated CA and a missing client certificate, with errors that say so."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from clickhouse_driver import Client
from clickhouse_driver.errors import Error as ClickHouseError
from clickhouse_driver.errors import NetworkError, ServerException
from confluent_kafka import Consumer, KafkaError, Producer

from fixtures_security import CLICKHOUSE_USER, KAFKA_USER, SecretValues
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka_secure import SecureKafkaServer
from glasspipe_dev.tls import Pki

pytestmark = pytest.mark.integration


def roundtrip(conf: dict[str, Any], topic: str, n: int = 20) -> list[bytes]:
    """Produce ``n`` records and read them back with the same client settings."""
    producer = Producer({**conf, "enable.idempotence": True})
    for i in range(n):
        producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode())
    assert producer.flush(30) == 0, "not delivered"
    consumer = Consumer({**conf, "group.id": f"smoke-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            value = msg.value() if msg is not None and msg.error() is None else None
            if value is not None:
                got.append(value)
    finally:
        consumer.close()
    return got


def first_error(conf: dict[str, Any], timeout: float = 10.0) -> KafkaError:
    """The first specific error librdkafka reports for a client that cannot connect (not "all brokers
    down", which follows every failure), after checking that it indeed got no metadata."""
    errors: list[KafkaError] = []
    producer = Producer({**conf, "error_cb": errors.append, "log_level": 0})
    deadline = time.monotonic() + timeout

    def specific() -> list[KafkaError]:
        return [e for e in errors if e.code() != KafkaError._ALL_BROKERS_DOWN]

    while not specific() and time.monotonic() < deadline:
        try:
            meta = producer.list_topics(timeout=1)
        except Exception:  # the failure we expect; its reason arrives through error_cb
            meta = None
        assert meta is None or not meta.topics, "the broker let in a client that it should have refused"
        producer.poll(0.2)
    assert specific(), f"no specific error reported: {[e.str() for e in errors]}"
    return specific()[0]


@pytest.mark.parametrize(("listener", "mechanism"), [
    ("SASL_SSL", "PLAIN"), ("SASL_SSL", "SCRAM-SHA-256"), ("SASL_SSL", "SCRAM-SHA-512"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512"), ("SASL_PLAINTEXT", "PLAIN"),
])
def test_sasl_listeners_take_the_right_password(
    secure_kafka: SecureKafkaServer, test_secrets: SecretValues, listener: str, mechanism: str
) -> None:
    topic = f"sec-{uuid.uuid4().hex[:8]}"
    secure_kafka.create_topic(topic)
    conf = secure_kafka.secure_client_config(listener, mechanism=mechanism, user=KAFKA_USER,
                                             password=test_secrets.kafka_password)
    assert sorted(roundtrip(conf, topic)) == sorted(f"v{i}".encode() for i in range(20))


def test_ssl_and_mtls_listeners_with_the_test_ca(secure_kafka: SecureKafkaServer, pki: Pki) -> None:
    mtls = secure_kafka.secure_client_config("MTLS", client_cert=pki.client.cert, client_key=pki.client.key)
    for conf in (secure_kafka.secure_client_config("SSL"), mtls):
        topic = f"sec-{uuid.uuid4().hex[:8]}"
        secure_kafka.create_topic(topic)
        assert len(roundtrip(conf, topic, 5)) == 5


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_wrong_password_is_an_authentication_error(secure_kafka: SecureKafkaServer, mechanism: str) -> None:
    err = first_error(secure_kafka.secure_client_config("SASL_SSL", mechanism=mechanism, user=KAFKA_USER,
                                                        password="not-the-password"))
    assert err.code() == KafkaError._AUTHENTICATION, err
    assert "Authentication failed" in err.str()


def test_an_unrelated_ca_fails_the_handshake(secure_kafka: SecureKafkaServer, pki: Pki,
                                              test_secrets: SecretValues) -> None:
    for conf in (
        secure_kafka.secure_client_config("SASL_SSL", mechanism="SCRAM-SHA-512", user=KAFKA_USER,
                                          password=test_secrets.kafka_password, ca=pki.other_ca_cert),
        secure_kafka.secure_client_config("SSL", ca=pki.other_ca_cert),
    ):
        err = first_error(conf)
        assert "certificate verify failed" in err.str(), err  # code _SSL or _TRANSPORT, by timing


def test_mtls_refuses_no_certificate_and_a_foreign_one(secure_kafka: SecureKafkaServer, pki: Pki) -> None:
    for conf in (
        secure_kafka.secure_client_config("MTLS"),
        secure_kafka.secure_client_config("MTLS", client_cert=pki.rogue_client.cert,
                                          client_key=pki.rogue_client.key),
    ):
        err = first_error(conf)
        assert "bad certificate" in err.str() or "certificate required" in err.str(), err


# ------------------------------------------------------------------------------------- ClickHouse


def test_clickhouse_tls_with_the_password_user(secure_clickhouse: ClickHouseServer, pki: Pki,
                                               test_secrets: SecretValues) -> None:
    c = secure_clickhouse.secure_client(str(pki.ca_cert), user=CLICKHOUSE_USER,
                                        password=test_secrets.clickhouse_password)
    try:
        assert c.execute("SELECT user FROM system.processes WHERE query LIKE '%whoami%'") == [(CLICKHOUSE_USER,)]
        c.execute("CREATE TABLE IF NOT EXISTS smoke_tls (k UInt32) ENGINE = MergeTree ORDER BY k")
        c.execute("INSERT INTO smoke_tls (k) VALUES", [list(range(50))], columnar=True)
        assert c.execute("SELECT count() FROM smoke_tls") == [(50,)]
    finally:
        c.disconnect()
    assert secure_clickhouse.version()[:2] >= (18, 16)  # the plain port is still there for checks


def test_clickhouse_refuses_a_wrong_password_an_unrelated_ca_and_plain_text(
    secure_clickhouse: ClickHouseServer, pki: Pki, test_secrets: SecretValues
) -> None:
    def fails(client: Client) -> ClickHouseError:
        try:
            with pytest.raises(ClickHouseError) as info:
                client.execute("SELECT 1")
            return info.value
        finally:
            client.disconnect()

    wrong_pw = fails(secure_clickhouse.secure_client(str(pki.ca_cert), user=CLICKHOUSE_USER, password="nope"))
    assert isinstance(wrong_pw, ServerException) and wrong_pw.code == 193, wrong_pw  # WRONG_PASSWORD
    wrong_ca = fails(secure_clickhouse.secure_client(str(pki.other_ca_cert), user=CLICKHOUSE_USER,
                                                     password=test_secrets.clickhouse_password))
    assert isinstance(wrong_ca, NetworkError) and "CERTIFICATE_VERIFY_FAILED" in str(wrong_ca), wrong_ca
    plain = fails(Client(host=secure_clickhouse.host, port=secure_clickhouse.secure_port, user=CLICKHOUSE_USER,
                         password=test_secrets.clickhouse_password, connect_timeout=3, send_receive_timeout=5))
    assert plain is not None  # a plain-text client on the TLS port gets nowhere
