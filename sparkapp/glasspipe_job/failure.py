"""How a replica reports why it stopped: one line, no secret, where Kubernetes shows it.

A failed driver pod's container status carries the pod's termination message (the file
``/dev/termination-log``); the operator reads it into the pipeline's Degraded condition, since
spark-operator's own ``errorMessage`` only says "driver container failed with ExitCode: 1". The same
line goes to stderr, prefixed ``glasspipe:``. Every message passes through ``redact`` first, so even a
library that echoed a password back could not put it there.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Iterable

from py4j.protocol import Py4JNetworkError

from glasspipe import contract

MAX_TERMINATION_MESSAGE = 4096  # the kubelet keeps at most this many bytes of the file
REDACTED = "<redacted>"


class JobFailure(Exception):
    """A failure whose message is safe to show (no secret values) and says what to fix."""


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of a secret value (and of its JAAS-quoted form) replaced."""
    for value in sorted({s for s in secrets if s}, key=len, reverse=True):
        for form in {value, value.replace("\\", "\\\\").replace('"', '\\"')}:
            text = text.replace(form, REDACTED)
    return text


# Java exceptions of Spark's Kafka connector (the Python checks before the query starts catch the same
# mistakes first; these cover what only the JVM sees).
_JAVA_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"SaslAuthenticationException|Authentication failed|Invalid username or password"),
     "SASL authentication to Kafka failed in Spark's Kafka connector: {detail}. Fix: the user name and password "
     "in the Secrets of spec.sources[].kafka.security.sasl"),
    (re.compile(r"PKIX path|SSLHandshakeException|certificate_unknown|unable to find valid certification path"),
     "TLS handshake with Kafka failed in Spark's Kafka connector: {detail}. Fix: the CA in the Secret of "
     "spec.sources[].kafka.security.tls.caSecretRef must be the one that signed the brokers' certificates"),
    (re.compile(r"bad_certificate|certificate_required"),
     "a Kafka broker refused the client certificate in Spark's Kafka connector: {detail}. Fix: "
     "spec.sources[].kafka.security.tls.clientCertSecretRef/clientKeySecretRef"),
]


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:1000]
    return ""


def _lost_jvm(exc: BaseException) -> bool:
    """Whether ``exc`` is py4j losing the driver's JVM: its own network error, or the socket error it raised
    while reconnecting to a JVM that is gone (a refused connection once the process died)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, Py4JNetworkError):
            return True
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    return False


def explain(exc: BaseException) -> str:
    """One line on why the replica stopped (not yet redacted)."""
    if isinstance(exc, JobFailure) or type(exc).__module__.startswith("glasspipe"):
        return str(exc)  # our own exceptions word their messages for people (SinkError, SpecInvalid, ...)
    if _lost_jvm(exc):
        return (f"the driver's Spark JVM is gone ({type(exc).__name__}: {_first_line(str(exc))}): it crashed (see "
                "the log above) or was killed, for example for memory (then raise spec.spark.driver.memory)")
    text = str(exc)
    for pattern, template in _JAVA_PATTERNS:
        m = pattern.search(text)
        if m:
            line = next((ln.strip() for ln in text.splitlines() if pattern.search(ln)), m.group(0))
            return template.format(detail=line[:1000])
    first = _first_line(text)
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def termination_log_path() -> str:
    return os.environ.get(contract.ENV_TERMINATION_LOG, contract.TERMINATION_LOG)


def report(message: str, secrets: Iterable[str]) -> str:
    """Print the (redacted) reason to stderr and leave it as the pod's termination message; returns it."""
    safe = redact(message, secrets)
    print(f"glasspipe: {safe}", file=sys.stderr, flush=True)
    path = termination_log_path()
    if os.path.isdir(os.path.dirname(path) or "."):
        try:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(safe.encode()[:MAX_TERMINATION_MESSAGE].decode(errors="ignore"))
        except OSError:  # not in a pod (no /dev/termination-log): stderr has it
            pass
    return safe


def report_exception(exc: BaseException, secrets: Iterable[str]) -> str:
    """The traceback (redacted) for whoever reads the driver log, then ``report(explain(exc))``."""
    secrets = list(secrets)
    print(redact("".join(traceback.format_exception(exc)), secrets), file=sys.stderr, flush=True)
    return report(explain(exc), secrets)
