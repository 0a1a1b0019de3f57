"""A test Kafka broker with secured listeners besides its PLAINTEXT one, for the security tests.

Listeners (each on its own free loopback port):

- ``PLAINTEXT``: as in KafkaServer: inter-broker traffic, the readiness probe and the tests' admin work.
- ``SASL_SSL``: TLS with the test CA's server certificate, then SASL PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
- ``SASL_PLAINTEXT``: the same SASL mechanisms without TLS.
- ``SSL``: TLS only (server authentication against a custom CA).
- ``MTLS``: TLS that requires a client certificate signed by the test CA (``ssl.client.auth=required``).

SCRAM credentials are created the way an operator of a KRaft cluster creates them before the first start:
``kafka-storage format --add-scram`` (StorageTool), so no extra JVM runs after the broker is up. PLAIN users
live in the listener's JAAS configuration, as on a real broker. There is no authorizer: an authenticated
user may do everything (authorization is not what these tests are about).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.process import free_port
from glasspipe_dev.tls import Pki

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
# listener name -> security protocol
LISTENERS = {"SASL_SSL": "SASL_SSL", "SASL_PLAINTEXT": "SASL_PLAINTEXT", "SSL": "SSL", "MTLS": "SSL"}
_SAFE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def _check_plain(what: str, value: str) -> str:
    """Names and passwords go into a .properties JAAS value and a StorageTool [name=..,password=..] list."""
    if not value or not set(value) <= _SAFE:
        raise ValueError(f"test Kafka {what} {value!r} must be non-empty letters, digits, '-', '_' or '.'")
    return value


class SecureKafkaServer(KafkaServer):
    """KafkaServer plus SASL_SSL, SASL_PLAINTEXT, SSL and mutual-TLS listeners (see the module docstring)."""

    def __init__(self, pki: Pki, users: Mapping[str, str], workdir: Path | None = None, **kwargs: object) -> None:
        super().__init__(workdir, **kwargs)  # type: ignore[arg-type]
        self.pki = pki
        self.users = {_check_plain("user name", u): _check_plain("password", p) for u, p in users.items()}
        taken = {self.port, self.controller_port}
        self.ports: dict[str, int] = {}
        for name in LISTENERS:
            port = free_port()
            while port in taken:
                port = free_port()
            taken.add(port)
            self.ports[name] = port

    def bootstrap_for(self, listener: str) -> str:
        """``bootstrap.servers`` of one listener: SASL_SSL, SASL_PLAINTEXT, SSL or MTLS (or PLAINTEXT)."""
        if listener == "PLAINTEXT":
            return self.bootstrap
        return f"{self.host}:{self.ports[listener]}"

    def _write_config(self) -> None:
        h = self.host
        plain_users = " ".join(f'user_{u}="{p}"' for u, p in sorted(self.users.items()))
        conf: dict[str, str] = {
            "listeners": ",".join([f"PLAINTEXT://{h}:{self.port}", f"CONTROLLER://{h}:{self.controller_port}",
                                   *(f"{n}://{h}:{p}" for n, p in self.ports.items())]),
            "advertised.listeners": ",".join([f"PLAINTEXT://{h}:{self.port}",
                                              *(f"{n}://{h}:{p}" for n, p in self.ports.items())]),
            "listener.security.protocol.map": ",".join(
                ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT", *(f"{n}:{p}" for n, p in LISTENERS.items())]),
            "sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
            # The broker's certificate (key + chain in one PEM file) and the CA it trusts for client certificates.
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.pki.server.chain_with_key),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.pki.ca_cert),
            "listener.name.mtls.ssl.client.auth": "required",
        }
        for listener in ("sasl_ssl", "sasl_plaintext"):
            conf[f"listener.name.{listener}.plain.sasl.jaas.config"] = (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};")
            for mech in SCRAM_MECHANISMS:
                conf[f"listener.name.{listener}.{mech.lower()}.sasl.jaas.config"] = (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;")
        self.extra_config = {**conf, **self.extra_config}
        super()._write_config()

    def _format_args(self) -> list[str]:
        args: list[str] = []
        for mech in SCRAM_MECHANISMS:
            for user, password in sorted(self.users.items()):
                args += ["--add-scram", f"{mech}=[name={user},password={password}]"]
        return args

    # -- clients -----------------------------------------------------------------------------

    def secure_client_config(
        self,
        listener: str,
        *,
        mechanism: str | None = None,
        user: str | None = None,
        password: str | None = None,
        ca: Path | None = None,
        client_cert: Path | None = None,
        client_key: Path | None = None,
        **extra: str | int | float | bool,
    ) -> dict[str, str | int | float | bool]:
        """A confluent-kafka config for one secured listener (defaults: the test CA, no client certificate)."""
        protocol = LISTENERS[listener]
        conf: dict[str, str | int | float | bool] = {
            "bootstrap.servers": self.bootstrap_for(listener), "security.protocol": protocol}
        if protocol.startswith("SASL"):
            conf.update({"sasl.mechanism": mechanism or "SCRAM-SHA-512", "sasl.username": user or "",
                         "sasl.password": password or ""})
        if protocol.endswith("SSL"):
            conf["ssl.ca.location"] = str(ca or self.pki.ca_cert)
            if client_cert is not None:
                conf["ssl.certificate.location"] = str(client_cert)
            if client_key is not None:
                conf["ssl.key.location"] = str(client_key)
        conf.update(extra)
        return conf
