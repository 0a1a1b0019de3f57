"""Session fixtures for the security tests: a test CA, a Kafka broker with secured listeners and a
ClickHouse with TLS and a password user (wired in via pytest_plugins).

They are separate servers from the ``kafka`` and ``clickhouse`` fixtures, started only when a test asks
for them, so the rest of the suite keeps its plain listeners and its start-up time. The passwords are
random per run: a leak scan can look for them anywhere without matching anything else.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from glasspipe_dev.clickhouse import INSTALL_HINT, ClickHouseServer
from glasspipe_dev.kafka_secure import SecureKafkaServer
from glasspipe_dev.paths import NotInstalledError
from glasspipe_dev.tls import Pki, make_pki
from server_fixture import started_server

KAFKA_USER = "glasspipe-job"
CLICKHOUSE_USER = "glasspipe_writer"


@dataclass(frozen=True)
class SecretValues:
    """The credentials the secure servers accept (and that nothing may ever print)."""

    kafka_password: str
    clickhouse_password: str

    @property
    def all(self) -> tuple[str, ...]:
        return (self.kafka_password, self.clickhouse_password)


@pytest.fixture(scope="session")
def test_secrets() -> SecretValues:
    return SecretValues(kafka_password=f"kpw-{secrets.token_hex(12)}",
                        clickhouse_password=f"cpw-{secrets.token_hex(12)}")


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Two CAs, a server certificate for 127.0.0.1 and client certificates, made once per run (~1 s)."""
    try:
        return make_pki(tmp_path_factory.mktemp("pki"))
    except NotInstalledError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def secure_kafka(pki: Pki, test_secrets: SecretValues) -> Iterator[SecureKafkaServer]:
    """A KRaft broker with PLAINTEXT, SASL_SSL, SASL_PLAINTEXT, SSL and MTLS listeners; one SCRAM/PLAIN user."""
    yield from started_server(lambda: SecureKafkaServer(pki, {KAFKA_USER: test_secrets.kafka_password}), "Kafka")


@pytest.fixture(scope="session")
def secure_clickhouse(pki: Pki, test_secrets: SecretValues) -> Iterator[ClickHouseServer]:
    """A ClickHouse with TLS on its secure native port and a password user (plus the plain port for checks)."""
    yield from started_server(
        lambda: ClickHouseServer(tls=pki.server, users={CLICKHOUSE_USER: test_secrets.clickhouse_password}),
        "ClickHouse", INSTALL_HINT)

