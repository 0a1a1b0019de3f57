"""The connection to ClickHouse: one clickhouse-driver client, rebuilt after errors, and retries with backoff."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from glasspipe_job.clickhouse.errors import MutationPending, SinkError, SinkUnavailable, is_transient
from glasspipe_job.clickhouse.mutations import DEFAULT_MUTATION_DEADLINE

log = logging.getLogger(__name__)

DEFAULT_PORT, DEFAULT_SECURE_PORT = 9000, 9440


class ClientLike(Protocol):
    """The part of clickhouse_driver.Client the sink uses (unit tests pass a recording fake)."""

    def execute(self, query: str, params: Any = None, **kwargs: Any) -> Any: ...

    def disconnect(self) -> None: ...


def parse_host(host: str, secure: bool) -> tuple[str, int]:
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit():
        return name, int(port)
    return host, DEFAULT_SECURE_PORT if secure else DEFAULT_PORT


class Connection:
    """A lazily made client for ``hosts`` (the first, then the others as alternatives) and a retry loop."""

    def __init__(
        self,
        hosts: Sequence[str],
        database: str,
        *,
        user: str = "default",
        password: str = "",
        secure: bool = False,
        ca_file: str | None = None,
        insert_block_size: int = 100_000,
        retry_deadline: float | None = None,
        mutation_deadline: float | None = DEFAULT_MUTATION_DEADLINE,
        max_backoff: float = 10.0,
        connect_timeout: float = 10.0,
        send_receive_timeout: float = 300.0,
        client_factory: Callable[[], ClientLike] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not hosts:
            raise ValueError("at least one ClickHouse host is needed")
        self.hosts = list(hosts)
        self.database = database
        self.user = user
        self.password = password
        self.secure = secure
        self.ca_file = ca_file
        self.insert_block_size = insert_block_size
        self.retry_deadline = retry_deadline
        self.mutation_deadline = mutation_deadline  # how long a DELETE the sink issued may take (mutations.py)
        self.max_backoff = max_backoff
        self.connect_timeout = connect_timeout
        self.send_receive_timeout = send_receive_timeout
        self._client_factory = client_factory or self._driver_client
        self._sleep = sleep
        self._clock = clock
        self._client: ClientLike | None = None

    def _driver_client(self) -> ClientLike:
        from clickhouse_driver import Client

        first, *alts = (parse_host(h, self.secure) for h in self.hosts)
        kwargs: dict[str, Any] = {}
        if self.secure:
            kwargs.update(secure=True, verify=True)
            if self.ca_file:
                kwargs["ca_certs"] = self.ca_file
        if alts:
            kwargs["alt_hosts"] = ",".join(f"{h}:{p}" for h, p in alts)
        return Client(
            host=first[0],
            port=first[1],
            database=self.database,
            user=self.user,
            password=self.password,
            client_name="glasspipe",
            connect_timeout=self.connect_timeout,
            send_receive_timeout=self.send_receive_timeout,
            sync_request_timeout=self.connect_timeout,
            # The driver splits an INSERT into blocks of this many rows, and only a single block is stored
            # all-or-nothing when the client dies mid-send: never let it split a chunk.
            settings={"insert_block_size": self.insert_block_size},
            **kwargs,
        )

    def clock(self) -> float:
        return self._clock()

    @property
    def client(self) -> ClientLike:
        if self._client is None:
            self._client = self._client_factory()
        return self._client

    def reset(self) -> None:
        """Drop the client (after an error); the next use makes a new one."""
        if self._client is not None:
            try:
                self._client.disconnect()
            except Exception:  # the connection is already broken; a new one is made on next use
                log.debug("disconnect failed", exc_info=True)
        self._client = None

    def close(self) -> None:
        self.reset()

    @contextmanager
    def retries_within(self, seconds: float) -> Iterator[None]:
        """Inside the block, retries give up after ``seconds`` (or the connection's own deadline, if sooner):
        for an answer worth having only soon, like a last check before the job reports why it stops."""
        saved = self.retry_deadline
        self.retry_deadline = seconds if saved is None else min(saved, seconds)
        try:
            yield
        finally:
            self.retry_deadline = saved

    def retrying(self, what: str, fn: Callable[[int], Any], describe: Callable[[BaseException], str]) -> Any:
        """Run fn(attempt) until it succeeds; transient errors wait (exp. backoff), reconnect and retry.
        A permanent error becomes a SinkError with ``describe(error)`` as its message."""
        start = self._clock()
        delay = 0.2
        attempt = 0
        while True:
            try:
                return fn(attempt)
            except SinkError:
                raise
            except Exception as e:
                if not is_transient(e):
                    raise SinkError(describe(e)) from e
                elapsed = self._clock() - start
                wait = delay * random.uniform(0.8, 1.2)  # jitter, so replicas do not retry in step
                if self.retry_deadline is not None and elapsed + wait > self.retry_deadline:
                    raise SinkUnavailable(
                        f"{what} on ClickHouse {self.hosts} failed for {elapsed:.0f} s (retry deadline "
                        f"{self.retry_deadline:.0f} s), last error: {describe(e)}"
                    ) from e
                attempt += 1
                log_fn = log.warning if attempt <= 3 or attempt % 10 == 0 else log.debug
                log_fn(
                    "%s: transient error (attempt %d, retrying in %.1f s): %s",
                    what,
                    attempt,
                    wait,
                    str(e).splitlines()[0] if str(e) else type(e).__name__,
                )
                if not isinstance(e, MutationPending):
                    self.reset()
                self._sleep(wait)  # never past the deadline: the check above counted this very wait
                delay = min(delay * 2, self.max_backoff)
