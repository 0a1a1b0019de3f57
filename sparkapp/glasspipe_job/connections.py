"""Before a replica starts: can it reach and log in to each Kafka and ClickHouse it uses? If not, say why.

Without this check a wrong password or CA shows up as librdkafka's "Local: Broker transport failure"
after a timeout, or as a Java stack trace from Spark's Kafka connector. librdkafka reports the real
cause (SASL authentication error, certificate verify failed, the broker's TLS alert) through its
error callback; ``describe_kafka_error`` turns it into "SASL authentication failed for user X on
broker Y" plus the spec field to fix. User names, brokers and Secret names appear; passwords never do.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from glasspipe.api import models
from glasspipe_job.config import JobConfig
from glasspipe_job.failure import JobFailure

CHECK_TIMEOUT = 30.0
log = logging.getLogger(__name__)


class ConnectionFailed(JobFailure):
    """The replica cannot reach or authenticate to a server; retrying would not help (or did not)."""


class Problem(StrEnum):
    AUTHENTICATION = "authentication"
    MECHANISM = "mechanism"
    SERVER_CERTIFICATE = "server_certificate"
    CLIENT_CERTIFICATE = "client_certificate"
    TLS = "tls"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class KafkaTarget:
    """What a connection check needs to word its message: no secret values."""

    what: str  # "source sms", "the dead-letter topic"
    bootstrap: str
    protocol: str
    mechanism: str | None
    user: str | None
    field: str  # spec path of the kafka block, e.g. spec.sources[0].kafka


def kafka_target(config: JobConfig, source: models.Source, what: str | None = None,
                 bootstrap: str | None = None) -> KafkaTarget:
    sec = source.kafka.security
    return KafkaTarget(
        what=what or f"source {source.name}",
        bootstrap=bootstrap or source.kafka.bootstrap_servers,
        protocol=sec.protocol,
        mechanism=sec.sasl.mechanism if sec.sasl else None,
        user=config.sasl_credentials(source)[0] if sec.sasl else None,
        field=f"spec.sources[{config.spec.sources.index(source)}].kafka",
    )


# "sasl_ssl://127.0.0.1:9093/bootstrap: SASL authentication error: ... (after 302ms in state AUTH_REQ)"
_BROKER = re.compile(r"^\s*(?:\w+://)?(?P<broker>[^/\s]+)/[^:\s]+:\s*(?P<detail>.*)$", re.S)
_AFTER = re.compile(r"\s*\(after \d+ms in state [A-Z_]+\)\s*(\(_[A-Z_]+\))?$")


def classify(code_name: str, text: str) -> Problem | None:
    """Which kind of failure a librdkafka error is; None for the noise around it ("all brokers down")."""
    low = text.lower()
    if code_name == "_ALL_BROKERS_DOWN":
        return None
    if "authentication failed" in low or "invalid username or password" in low or (
            code_name == "_AUTHENTICATION" and "mechanism" not in low):
        return Problem.AUTHENTICATION
    if "sasl" in low and ("mechanism" in low and ("handshake failed" in low or "not supported" in low)):
        return Problem.MECHANISM
    if "certificate verify failed" in low or "could not be verified" in low:
        return Problem.SERVER_CERTIFICATE
    if "bad certificate" in low or "certificate required" in low or "alert number 42" in low or (
            "alert number 116" in low or "unknown ca" in low):
        return Problem.CLIENT_CERTIFICATE
    if code_name == "_SSL" or "ssl handshake" in low:
        return Problem.TLS
    return Problem.UNREACHABLE


def describe_kafka_error(problem: Problem, text: str, target: KafkaTarget) -> str:
    """The message for one classified librdkafka error: what failed, where, and which field fixes it."""
    m = _BROKER.match(text)
    broker = m.group("broker") if m else target.bootstrap
    detail = _AFTER.sub("", (m.group("detail") if m else text).strip())
    sec = f"{target.field}.security"
    if problem is Problem.AUTHENTICATION:
        return (f"SASL authentication failed for user {target.user!r} on broker {broker} ({target.what}, mechanism "
                f"{target.mechanism}): {detail}. Fix: the user name and password in the Secrets of "
                f"{sec}.sasl.usernameSecretRef and {sec}.sasl.passwordSecretRef, or the user's {target.mechanism} "
                "credentials on the Kafka cluster")
    if problem is Problem.MECHANISM:
        return (f"broker {broker} ({target.what}) does not accept SASL mechanism {target.mechanism} on this "
                f"listener: {detail}. Fix: {sec}.sasl.mechanism, or {target.field}.bootstrapServers (another "
                "listener)")
    if problem is Problem.SERVER_CERTIFICATE:
        return (f"TLS: the certificate of broker {broker} ({target.what}) could not be verified: {detail}. Fix: "
                f"put the CA that signed the brokers' certificates in the Secret of {sec}.tls.caSecretRef")
    if problem is Problem.CLIENT_CERTIFICATE:
        return (f"broker {broker} ({target.what}) refused the TLS client certificate (mutual TLS): {detail}. Fix: "
                f"set {sec}.tls.clientCertSecretRef and clientKeySecretRef to a certificate signed by a CA the "
                "brokers trust")
    if problem is Problem.TLS:
        return (f"TLS handshake with broker {broker} ({target.what}) failed: {detail}. Fix: {sec}.protocol must "
                f"match the listener of {target.field}.bootstrapServers")
    return (f"cannot reach Kafka {target.bootstrap} ({target.what}) over {target.protocol}: {detail}. Fix: "
            f"{target.field}.bootstrapServers, and {sec}.protocol matching the brokers' listener")


def check_kafka(conf: Mapping[str, Any], target: KafkaTarget, timeout: float = CHECK_TIMEOUT,
                clock: Callable[[], float] = time.monotonic) -> None:
    """Fetch metadata with the replica's own client settings; raise ConnectionFailed with the cause.

    Authentication and certificate problems fail at once (they do not heal by waiting); an unreachable
    cluster is retried until ``timeout``."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    errors: list[Any] = []
    client_conf: dict[str, Any] = {**conf, "error_cb": errors.append}
    admin = AdminClient(client_conf)
    deadline = clock() + timeout
    last = "no answer"
    while True:
        try:
            meta = admin.list_topics(timeout=2)
            if meta.brokers:
                return
        except KafkaException as e:
            last = str(e.args[0].str() if e.args and hasattr(e.args[0], "str") else e)
        admin.poll(0.1)  # serves error_cb
        seen = [(classify(e.name(), e.str()), e.str()) for e in errors]
        permanent = [(p, t) for p, t in seen if p is not None and p is not Problem.UNREACHABLE]
        if permanent:
            raise ConnectionFailed(describe_kafka_error(*permanent[0], target))
        if clock() > deadline:
            reasons = [t for p, t in seen if p is Problem.UNREACHABLE]
            raise ConnectionFailed(describe_kafka_error(
                Problem.UNREACHABLE, reasons[-1] if reasons else f"{last} after {timeout:.0f} s", target))


def check_kafka_connections(config: JobConfig, timeout: float = CHECK_TIMEOUT) -> None:
    """Every Kafka this replica talks to: each source, and the dead-letter topic's brokers if they differ."""
    spec = config.spec
    for source in spec.sources:
        check_kafka(config.librdkafka_options(source), kafka_target(config, source), timeout)
    dl = spec.dead_letter.bootstrap_servers
    if dl and dl != spec.sources[0].kafka.bootstrap_servers:
        conf = {**config.librdkafka_options(spec.sources[0]), "bootstrap.servers": dl}
        what = "the dead-letter topic of spec.deadLetter.bootstrapServers"
        check_kafka(conf, kafka_target(config, spec.sources[0], what, dl), timeout)


def check_clickhouse(config: JobConfig, timeout: float = CHECK_TIMEOUT) -> None:
    """``SELECT 1`` on the sink's hosts with its user, password and TLS settings; ConnectionFailed if it
    cannot work (wrong password, unverifiable certificate). A server still unreachable after ``timeout``
    is only logged: the sink waits for it, as it does for an outage mid-run."""
    from glasspipe_job.clickhouse.connection import Connection
    from glasspipe_job.clickhouse.errors import SinkError, SinkUnavailable, describe_error

    ch = config.spec.sink.clickhouse
    user, password = config.clickhouse_credentials
    conn = Connection(ch.hosts, ch.database, user=user, password=password, secure=ch.secure,
                      ca_file=config.clickhouse_ca_file, retry_deadline=timeout, connect_timeout=min(timeout, 10.0))
    where = (f"connecting to ClickHouse {', '.join(ch.hosts)} as user {user!r} "
             f"({'TLS' if ch.secure else 'no TLS'}, spec.sink.clickhouse)")
    try:
        conn.retrying("connecting", lambda _attempt: conn.client.execute("SELECT 1"),
                      lambda e: describe_error(e, ch.database, ch.table, where))
    except SinkUnavailable as e:
        log.warning("%s; starting anyway, the sink keeps retrying", e)
    except SinkError as e:
        raise ConnectionFailed(str(e)) from None
    finally:
        conn.close()


def check_connections(config: JobConfig, timeout: float = CHECK_TIMEOUT) -> None:
    """Kafka, then ClickHouse: before the Spark session starts, so a wrong Secret costs seconds, not a JVM."""
    check_kafka_connections(config, timeout)
    check_clickhouse(config, timeout)
