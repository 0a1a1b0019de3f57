"""The body every session server fixture shares: make the server (fail, never skip, when it is not
installed), start it, yield it, close it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

import pytest

from glasspipe_dev.paths import NotInstalledError


class _Server(Protocol):
    def start(self) -> object: ...
    def close(self) -> None: ...


S = TypeVar("S", bound=_Server)


def started_server(make: Callable[[], S], what: str, fix: str = "") -> Iterator[S]:
    """``yield from started_server(KafkaServer, "Kafka")`` in a session fixture."""
    try:
        server = make()
    except NotInstalledError as e:
        pytest.fail(f"{what} is not installed: {e}{f'. Fix: {fix}' if fix else ''}", pytrace=False)
    try:
        server.start()
        yield server
    finally:
        server.close()
