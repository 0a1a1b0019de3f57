"""Exactly-once ClickHouse writer that the streaming job calls from ``foreachBatch``.

Spark replays a micro-batch after a crash with the same batch id and the same rows, so every write is
keyed by ``(writer_id, batch_id)`` and made idempotent; docs/exactly-once.md explains the protocol and
the experiments behind it. This module never imports pyspark: it receives plain Python columns (as
``pyarrow``'s ``to_pylist()`` gives them), so it is unit-testable without a JVM.

Two mechanisms, chosen from the server version at open():

* ``marker`` (every version, incl. Debian's 18.16): the data table has a ``_glasspipe_batch String``
  column holding ``"{writer_id}/{batch_id}/{chunk}"``. A chunk is sent as exactly ONE native-protocol
  block, which the server stores all-or-nothing when the client dies (bench/clickhouse_experiments.py).
  Before the first insert of a sink's life and after any failed attempt, the chunks of the batch already
  in the table are counted and skipped; a ledger row closes the batch.
* ``token`` (ClickHouse >= 22.2): ``insert_deduplication_token`` per chunk on a Replicated table or a
  MergeTree with ``non_replicated_deduplication_window``; the server drops a re-sent chunk itself.
  The ledger is written the same way: it records the Kafka offsets each batch committed.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import random
import re
import ssl
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Any, Protocol

log = logging.getLogger(__name__)

MARKER_COLUMN = "_glasspipe_batch"
LEDGER_TABLE = "glasspipe_ledger"
# insert_deduplication_token appeared in 22.2 (ClickHouse changelog 2022); below it only the marker works.
TOKEN_MIN_VERSION = (22, 2)
# LowCardinality needs allow_experimental_low_cardinality_type=1 before it went GA in 19.x; the setting
# is an obsolete no-op later, so it is only sent to servers that need it.
LOW_CARDINALITY_FLAG_UNTIL = (19, 3)
DEDUP_WINDOW = 10_000
DEFAULT_PORT, DEFAULT_SECURE_PORT = 9000, 9440

# ServerException codes worth waiting for: the server is overloaded, restarting, or a replica/Keeper
# hiccups. Everything else (unknown table/column, types, auth, syntax) will fail the same way again.
TRANSIENT_CODES: frozenset[int] = frozenset(
    {
        3,  # UNEXPECTED_END_OF_FILE (connection cut mid-packet)
        32,  # ATTEMPT_TO_READ_AFTER_EOF
        159,  # TIMEOUT_EXCEEDED
        201,  # QUOTA_EXPIRED: the quota interval ends
        202,  # TOO_MANY_SIMULTANEOUS_QUERIES
        203,  # NO_FREE_CONNECTION
        209,  # SOCKET_TIMEOUT
        210,  # NETWORK_ERROR
        225,  # NO_ZOOKEEPER
        236,  # ABORTED
        241,  # MEMORY_LIMIT_EXCEEDED
        242,  # TABLE_IS_READ_ONLY (replica lost its Keeper session)
        243,  # NOT_ENOUGH_SPACE (merges or an operator free it)
        252,  # TOO_MANY_PARTS (merges catch up) -- but see _PERMANENT_252
        279,  # ALL_CONNECTION_TRIES_FAILED
        285,  # TOO_FEW_LIVE_REPLICAS
        286,  # UNSATISFIED_QUORUM_FOR_PREVIOUS_WRITE
        319,  # UNKNOWN_STATUS_OF_INSERT
        394,  # QUERY_WAS_CANCELLED (server shutting down)
        425,  # SYSTEM_ERROR
        439,  # CANNOT_SCHEDULE_TASK
        473,  # DEADLOCK_AVOIDED (lock wait timed out)
        999,  # KEEPER_EXCEPTION
        1000,  # POCO_EXCEPTION (e.g. connection reset inside the server)
    }
)
# Code 252 also means "Too many partitions for single INSERT block": that one never gets better.
_PERMANENT_252 = "too many partitions"

# Permanent codes with a known fix, shown in SinkError messages.
_MISSING_COLUMN = (
    "a column is missing in {table}: ALTER TABLE {table} ADD COLUMN ..., or fix the column names"
)
_FIXES: dict[int, str] = {
    60: "the table does not exist: create it, or set spec.sink.clickhouse.createTable: true",
    81: "the database does not exist: run CREATE DATABASE {database} (or fix spec.sink.clickhouse.database)",
    16: _MISSING_COLUMN,
    8: _MISSING_COLUMN,
    10: _MISSING_COLUMN,
    47: "an identifier is unknown: check the column names of {table}",
    53: "a value does not fit its column type in {table}: fix the column's type in the spec or the table",
    70: "a value cannot be converted to its column type in {table}: fix the column's type (spec or table)",
    44: "a column of {table} has a type the values cannot go into: fix the type in the spec or the table",
    62: "glasspipe sent SQL the server cannot parse (a bug; please report it with this message)",
    115: "the server does not know a setting glasspipe sent (a bug for this version; please report it)",
    164: "the user is read-only: grant it INSERT on {table} (and CREATE TABLE on {database} for the ledger)",
    192: "unknown user: fix the credentials Secret of spec.sink.clickhouse.credentialsSecretRef",
    193: "wrong password: fix the credentials Secret of spec.sink.clickhouse.credentialsSecretRef",
    194: "password required: set spec.sink.clickhouse.credentialsSecretRef",
    195: "the user may not connect from this address: allow the Spark pods' network for it",
    497: "access denied: GRANT INSERT, SELECT ON {table} and CREATE TABLE, INSERT, SELECT ON "
    "{database}.glasspipe_ledger to the sink's user",
    516: "authentication failed: fix the credentials Secret of spec.sink.clickhouse.credentialsSecretRef",
}


class SinkError(Exception):
    """A write that will not succeed by retrying: the message names the table/column and the fix."""


class SinkUnavailable(SinkError):
    """ClickHouse stayed unreachable/overloaded past the configured retry deadline."""


class Mechanism(StrEnum):
    MARKER = "marker"
    TOKEN = "token"


@dataclass(frozen=True)
class WriteResult:
    rows_written: int  # rows inserted by this call (skipped chunks and replays excluded)
    chunks: int  # chunks the batch consists of
    skipped_replay: bool  # the ledger already had this batch: nothing was written
    chunks_skipped: int = 0  # chunks found already in the table (a crashed predecessor wrote them)
    attempts: int = 1


@dataclass(frozen=True)
class LedgerEntry:
    batch_id: int
    chunks: int
    rows: int
    offsets: str


class SinkColumn(Protocol):
    """What the sink needs of an output column (glasspipe.api.validation.OutputColumn has it)."""

    @property
    def name(self) -> str: ...

    @property
    def clickhouse_type(self) -> str: ...


class ClientLike(Protocol):
    """The part of clickhouse_driver.Client the sink uses (unit tests pass a recording fake)."""

    def execute(self, query: str, params: Any = None, **kwargs: Any) -> Any: ...

    def disconnect(self) -> None: ...


# ------------------------------------------------------------------------------------ small pure helpers


def parse_version(text: str) -> tuple[int, ...]:
    """'18.16.1' -> (18, 16, 1); '24.8.4.13' -> (24, 8, 4, 13)."""
    m = re.match(r"\s*(\d+(?:\.\d+)*)", text)
    if not m:
        raise SinkError(f"cannot parse the ClickHouse version {text!r}")
    return tuple(int(p) for p in m.group(1).split("."))


def quote_ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def marker_value(writer_id: str, batch_id: int, chunk: int) -> str:
    """The marker column value and the deduplication token of one chunk."""
    return f"{writer_id}/{batch_id}/{chunk}"


def chunk_bounds(n_rows: int, max_rows: int) -> list[tuple[int, int]]:
    """[start, end) row ranges of at most max_rows rows; an empty batch has no chunks."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    return [(lo, min(lo + max_rows, n_rows)) for lo in range(0, n_rows, max_rows)]


def parse_host(host: str, secure: bool) -> tuple[str, int]:
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit():
        return name, int(port)
    return host, DEFAULT_SECURE_PORT if secure else DEFAULT_PORT


def strip_type(ch_type: str) -> tuple[str, bool, bool]:
    """(inner type, nullable, low cardinality) of e.g. 'LowCardinality(Nullable(String))'."""
    t = ch_type.strip()
    low = nullable = False
    if t.startswith("LowCardinality(") and t.endswith(")"):
        low, t = True, t[len("LowCardinality(") : -1].strip()
    if t.startswith("Nullable(") and t.endswith(")"):
        nullable, t = True, t[len("Nullable(") : -1].strip()
    return t, nullable, low


def is_transient(exc: BaseException) -> bool:
    """Retry this error (after reconnecting), or give up on it?"""
    from clickhouse_driver import errors

    if isinstance(exc, errors.ServerException):
        if exc.code == 252 and _PERMANENT_252 in str(exc.message).lower():
            return False
        return exc.code in TRANSIENT_CODES
    if isinstance(exc, errors.NetworkError):
        msg = str(exc.message or "").lower()
        return "certificate verify failed" not in msg and "no such file" not in msg
    if isinstance(exc, ssl.SSLCertVerificationError | FileNotFoundError | PermissionError):
        return False
    return isinstance(
        exc,
        errors.SocketTimeoutError
        | errors.UnexpectedPacketFromServerError
        | errors.UnknownPacketFromServerError
        | errors.PartiallyConsumedQueryError
        | EOFError  # the driver's buffered reader raises the builtin EOFError when a socket closes
        | OSError  # ConnectionRefusedError, ConnectionResetError, BrokenPipeError, socket.timeout
        | _MutationPending,
    )


def describe_error(exc: BaseException, database: str, table: str) -> str:
    """A one-paragraph explanation of a permanent error: what failed and how to fix it."""
    code = getattr(exc, "code", None)
    raw = str(getattr(exc, "message", None) or exc).strip()
    first = raw.splitlines()[0] if raw else type(exc).__name__
    first = first.split(" Stack trace:")[0]
    full = f"{quote_ident(database)}.{quote_ident(table)}"
    fix = _FIXES.get(code) if isinstance(code, int) else None
    if code == 252:
        fix = (
            "one micro-batch touches more partitions than max_partitions_per_insert_block allows: lower "
            "spec.sink.clickhouse.batching.maxRows, coarsen the table's PARTITION BY, or raise the setting"
        )
    where = f"writing to ClickHouse table {full}"
    text = (
        f"{where} failed: {type(exc).__name__} (code {code}): {first}" if code else f"{where} failed: {first}"
    )
    if fix:
        text += ". Fix: " + fix.format(database=quote_ident(database), table=full)
    return text


class _MutationPending(Exception):
    """A delete of partially written chunks is still running; treated as transient."""


# ------------------------------------------------------------------------------------ value conversion

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_US = dt.timedelta(microseconds=1)
_ONE_S = dt.timedelta(seconds=1)

Converter = Callable[[Any], Any]


def _as_utc(v: dt.datetime) -> dt.datetime:
    """Spark runs with session time zone UTC: naive timestamps from to_pylist() are UTC wall-clock."""
    return v.replace(tzinfo=dt.UTC) if v.tzinfo is None else v


def _epoch_micros(v: Any) -> int:
    if isinstance(v, dt.datetime):
        return (_as_utc(v) - _EPOCH) // _ONE_US
    if isinstance(v, dt.date):
        return (dt.datetime(v.year, v.month, v.day, tzinfo=dt.UTC) - _EPOCH) // _ONE_US
    if isinstance(v, str):
        return _epoch_micros(dt.datetime.fromisoformat(v))
    if isinstance(v, int | float | Decimal):
        return int(v * 1_000_000)  # numbers are epoch seconds
    raise TypeError(f"cannot convert {type(v).__name__} {v!r} to a timestamp")


def _to_datetime(v: Any) -> int:
    # Epoch seconds: the driver would read a naive datetime in the CLIENT's local zone, an int as-is.
    if isinstance(v, dt.datetime):
        return int((v if v.tzinfo is not None else v.replace(tzinfo=dt.UTC)).timestamp())  # C-fast path
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    return _epoch_micros(v) // 1_000_000


def _datetime64(scale: int) -> Converter:
    def conv(v: Any) -> int:
        us = _epoch_micros(v)
        return us * 10 ** (scale - 6) if scale >= 6 else us // 10 ** (6 - scale)

    return conv


def _to_date(v: Any) -> dt.date:
    if isinstance(v, dt.datetime):
        return _as_utc(v).astimezone(dt.UTC).date()
    if isinstance(v, dt.date):
        return v
    if isinstance(v, str):
        return dt.date.fromisoformat(v[:10])
    raise TypeError(f"cannot convert {type(v).__name__} {v!r} to a date")


def _to_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dt.datetime):
        u = _as_utc(v).astimezone(dt.UTC)
        return u.strftime("%Y-%m-%d %H:%M:%S") + (f".{u.microsecond:06d}" if u.microsecond else "")
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, Decimal):
        return format(v, "f")
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _to_int(v: Any) -> int:
    if isinstance(v, int):
        return int(v)  # bool -> 0/1
    if isinstance(v, float) and not math.isfinite(v):
        raise TypeError(f"{v} has no integer value")
    if isinstance(v, str):
        return int(v.strip())
    return int(v)


def _to_float(v: Any) -> float:
    return float(v)


def _to_bool(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "t", "yes")
    return bool(v)


def _to_decimal(v: Any) -> Any:
    if isinstance(v, Decimal | int) and not isinstance(v, bool):
        return v
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        return Decimal(repr(v))
    return Decimal(str(v))


def _to_uuid(v: Any) -> str:
    return str(v)


def converter_for(ch_type: str) -> tuple[Converter | None, frozenset[type]]:
    """The per-value conversion for a ClickHouse column type (None: values pass as they are), and the
    Python types the driver writes correctly as they are (a column of only those is just copied)."""
    inner, _, _ = strip_type(ch_type)
    base = inner.split("(")[0]
    if base in ("String", "FixedString"):
        return _to_str, frozenset({str})
    if re.fullmatch(r"U?Int(8|16|32|64|128|256)", base):
        return _to_int, frozenset({int})  # type(True) is bool: booleans are converted
    if base in ("Float32", "Float64"):
        return _to_float, frozenset({float})
    if base == "Bool":
        return _to_bool, frozenset({bool})
    if base == "Date" or base == "Date32":
        return _to_date, frozenset({dt.date})
    if base == "DateTime":
        return _to_datetime, frozenset({int})
    if base == "DateTime64":
        m = re.match(r"DateTime64\(\s*(\d+)", inner)
        return _datetime64(int(m.group(1)) if m else 3), frozenset()
    if base.startswith("Decimal"):
        return _to_decimal, frozenset({Decimal, int})
    if base == "UUID":
        return _to_uuid, frozenset({str})
    return None, frozenset()  # Array, Map, Enum...: what Spark gives is what the driver takes


def convert_column(name: str, ch_type: str, values: Sequence[Any]) -> list[Any]:
    """A new list with every value in the form clickhouse-driver writes correctly for ch_type."""
    _, nullable, _ = strip_type(ch_type)
    conv, native = converter_for(ch_type)
    if not nullable and None in values:
        for i, v in enumerate(values):
            if v is None:
                raise SinkError(
                    f"column {name!r} ({ch_type}) got NULL (first at row {i} of the batch); declare the "
                    f"column Nullable({ch_type}) in the spec and the table, or make the field non-nullable "
                    "(records without it then go to the dead-letter topic)"
                )
    if conv is None or set(map(type, values)) - {type(None)} <= native:
        return list(values)
    try:
        return [None if v is None else conv(v) for v in values]
    except (TypeError, ValueError, ArithmeticError) as e:
        bad = next((v for v in values if v is not None and not _converts(conv, v)), None)
        raise SinkError(
            f"column {name!r} ({ch_type}): cannot convert value {bad!r} ({type(bad).__name__}): {e}; "
            "fix the column's type or its expression"
        ) from e


def _converts(conv: Converter, v: Any) -> bool:
    try:
        conv(v)
        return True
    except Exception:
        return False


def canonical_order(columns: Sequence[Sequence[Any]]) -> list[int]:
    """Row indices sorted by the rows' values: chunk k holds the same rows however Spark ordered a replay.

    Only needed when a batch spans several chunks. None sorts last and NaN after numbers, so the order
    is total (a NaN compares unequal to everything and would make sorted() order-dependent).
    """
    keycols: list[Sequence[Any]] = []
    for col in columns:
        has_none = any(v is None for v in col)
        has_nan = any(isinstance(v, float) and v != v for v in col)
        if has_none or has_nan:
            keycols.append([(2, 0) if v is None else (1, 0) if v != v else (0, v) for v in col])
        else:
            keycols.append(col)
    n = len(columns[0]) if columns else 0
    if not keycols:
        return list(range(n))
    keys = list(zip(*keycols, strict=True))
    return sorted(range(n), key=keys.__getitem__)


# ------------------------------------------------------------------------------------ mechanism choice


def choose_mechanism(
    version: Sequence[int], engine: str, engine_full: str, has_marker: bool, table: str
) -> Mechanism:
    """The exactly-once mechanism this table on this server version supports, or SinkError saying why none."""
    if "MergeTree" not in engine:
        raise SinkError(
            f"table {table} has engine {engine}; glasspipe writes exactly once only into MergeTree tables "
            "(write into the local MergeTree table, not a Distributed, Buffer or other engine)"
        )
    if tuple(version) >= TOKEN_MIN_VERSION:
        replicated = engine.startswith("Replicated")
        m = re.search(r"non_replicated_deduplication_window\s*=\s*(\d+)", engine_full)
        if replicated or (m and int(m.group(1)) > 0):
            return Mechanism.TOKEN
        if has_marker:
            return Mechanism.MARKER
        raise SinkError(
            f"table {table} is a non-replicated {engine} without deduplication, so a retried INSERT would be "
            f"stored twice. Fix: ALTER TABLE {table} MODIFY SETTING non_replicated_deduplication_window = "
            f"{DEDUP_WINDOW} (or ALTER TABLE {table} ADD COLUMN {MARKER_COLUMN} String DEFAULT '')"
        )
    if has_marker:
        return Mechanism.MARKER
    v = ".".join(str(p) for p in version)
    raise SinkError(
        f"table {table} has no {MARKER_COLUMN} column, which glasspipe needs for exactly-once writes on "
        f"ClickHouse {v} (< 22.2). Fix: ALTER TABLE {table} ADD COLUMN {MARKER_COLUMN} String DEFAULT '' "
        "(or upgrade ClickHouse to 22.2+, where insert_deduplication_token is used instead)"
    )


# ------------------------------------------------------------------------------------ the sink


# What follows a pipeline's writer prefix ("<namespace>.<pipeline>."): the replica ("0", before the
# hand-over decides) or "<replica>of<replicas>-<hex>" (handover.new_writer_id).
WRITER_SUFFIX_PATTERN = "^[0-9]+(of[0-9]+-[0-9a-f]+)?$"


class ClickHouseSink:
    """Writes micro-batches into one ClickHouse table, each (writer_id, batch_id) exactly once."""

    def __init__(
        self,
        hosts: Sequence[str],
        database: str,
        table: str,
        columns: Sequence[SinkColumn],
        writer_id: str,
        max_rows: int = 100_000,
        user: str = "default",
        password: str = "",
        secure: bool = False,
        ca_file: str | None = None,
        create_table: bool = False,
        order_by: Sequence[str] | None = None,
        *,
        retry_deadline: float | None = None,
        max_backoff: float = 10.0,
        connect_timeout: float = 10.0,
        send_receive_timeout: float = 300.0,
        client_factory: Callable[[], ClientLike] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not hosts:
            raise ValueError("at least one ClickHouse host is needed")
        if not writer_id or "/" in writer_id:
            raise ValueError(f"writer_id must be non-empty and contain no '/', got {writer_id!r}")
        if not columns:
            raise ValueError("at least one output column is needed")
        names = [c.name for c in columns]
        if len(set(names)) != len(names) or MARKER_COLUMN in names:
            raise ValueError(f"column names must be unique and not {MARKER_COLUMN!r}: {names}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.hosts = list(hosts)
        self.database = database
        self.table = table
        self.columns = list(columns)
        self.writer_id = writer_id
        self.max_rows = max_rows
        self.user = user
        self.password = password
        self.secure = secure
        self.ca_file = ca_file
        self.create_table = create_table
        self.order_by = list(order_by) if order_by else None
        self.retry_deadline = retry_deadline
        self.max_backoff = max_backoff
        self.connect_timeout = connect_timeout
        self.send_receive_timeout = send_receive_timeout
        self._client_factory = client_factory or self._driver_client
        self._sleep = sleep
        self._clock = clock
        self._client: ClientLike | None = None
        self.version: tuple[int, ...] | None = None
        self.mechanism: Mechanism | None = None
        self.table_types: dict[str, str] = {}
        self.has_marker = False
        # No batch written yet, or the last write_batch failed: chunks of the next batch may be in the table
        # already (from a crashed predecessor, or from our own failed call that Spark now retries).
        self._fresh = True

    # -- names

    @property
    def full_table(self) -> str:
        return f"{quote_ident(self.database)}.{quote_ident(self.table)}"

    @property
    def ledger_table(self) -> str:
        return f"{quote_ident(self.database)}.{quote_ident(LEDGER_TABLE)}"

    # -- connection

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
            settings={"insert_block_size": self.max_rows},
            **kwargs,
        )

    @property
    def client(self) -> ClientLike:
        if self._client is None:
            self._client = self._client_factory()
        return self._client

    def _reset_client(self) -> None:
        if self._client is not None:
            try:
                self._client.disconnect()
            except Exception:  # the connection is already broken; a new one is made on next use
                log.debug("disconnect failed", exc_info=True)
        self._client = None

    def close(self) -> None:
        self._reset_client()

    def __enter__(self) -> ClickHouseSink:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- retries

    def _retrying(self, what: str, fn: Callable[[int], Any]) -> Any:
        """Run fn(attempt) until it succeeds; transient errors wait (exp. backoff), reconnect and retry."""
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
                    raise SinkError(describe_error(e, self.database, self.table)) from e
                elapsed = self._clock() - start
                if self.retry_deadline is not None and elapsed + delay > self.retry_deadline:
                    raise SinkUnavailable(
                        f"{what} on ClickHouse {self.hosts} failed for {elapsed:.0f} s (retry deadline "
                        f"{self.retry_deadline:.0f} s), last error: "
                        f"{describe_error(e, self.database, self.table)}"
                    ) from e
                attempt += 1
                log_fn = log.warning if attempt <= 3 or attempt % 10 == 0 else log.debug
                log_fn(
                    "%s: transient error (attempt %d, retrying in %.1f s): %s",
                    what,
                    attempt,
                    delay,
                    str(e).splitlines()[0] if str(e) else type(e).__name__,
                )
                if not isinstance(e, _MutationPending):
                    self._reset_client()
                self._sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self.max_backoff)

    # -- open

    def open(self) -> ClickHouseSink:
        """Detect the version, create tables when asked, inspect the table, choose the mechanism."""
        if self.mechanism is None:
            self._retrying("opening the sink", lambda _attempt: self._open())
        return self

    def _open(self) -> None:
        c = self.client
        self.version = parse_version(str(c.execute("SELECT version()")[0][0]))
        if self.create_table:
            self._execute_ddl(self.create_table_sql(), self._ddl_settings())
        self._execute_ddl(self.ledger_sql(), {})
        has_ledger = c.execute(
            "SELECT count() FROM system.tables WHERE database = %(db)s AND name = %(t)s",
            {"db": self.database, "t": LEDGER_TABLE},
        )[0][0]
        if not has_ledger:
            raise SinkError(
                f"the ledger table {self.ledger_table} does not exist and the sink's user may not create it. "
                f"Fix: run {self.ledger_sql()} as an admin, and GRANT SELECT, INSERT ON {self.ledger_table}"
            )
        found = c.execute(
            "SELECT name, type FROM system.columns WHERE database = %(db)s AND table = %(t)s",
            {"db": self.database, "t": self.table},
        )
        if not found:
            raise SinkError(
                f"ClickHouse table {self.full_table} does not exist. Fix: create it (it needs the output "
                f"columns {', '.join(c.name for c in self.columns)}), "
                "or set spec.sink.clickhouse.createTable: true"
            )
        self.table_types = {str(n): str(t) for n, t in found}
        missing = [col for col in self.columns if col.name not in self.table_types]
        if missing:
            adds = "; ".join(
                f"ALTER TABLE {self.full_table} ADD COLUMN {quote_ident(col.name)} {col.clickhouse_type}"
                for col in missing
            )
            raise SinkError(
                f"ClickHouse table {self.full_table} lacks column(s) "
                f"{', '.join(col.name for col in missing)}. "
                f"Fix: {adds} (or fix the column names in spec.sink.clickhouse.columns)"
            )
        for col in self.columns:
            if self.table_types[col.name].replace(" ", "") != col.clickhouse_type.replace(" ", ""):
                log.warning(
                    "column %s is %s in %s, the spec says %s: values are converted for the table's type",
                    col.name,
                    self.table_types[col.name],
                    self.full_table,
                    col.clickhouse_type,
                )
        marker_type = self.table_types.get(MARKER_COLUMN)
        if marker_type is not None and strip_type(marker_type)[0] != "String":
            raise SinkError(
                f"column {MARKER_COLUMN} of {self.full_table} is {marker_type}; it must be String. Fix: "
                f"ALTER TABLE {self.full_table} MODIFY COLUMN {MARKER_COLUMN} String DEFAULT ''"
            )
        self.has_marker = marker_type is not None
        engine, engine_full = c.execute(
            "SELECT engine, engine_full FROM system.tables WHERE database = %(db)s AND name = %(t)s",
            {"db": self.database, "t": self.table},
        )[0]
        self.mechanism = choose_mechanism(
            self.version, str(engine), str(engine_full), self.has_marker, self.full_table
        )
        log.info(
            "ClickHouse %s, table %s (%s): exactly-once by %s",
            ".".join(map(str, self.version)),
            self.full_table,
            engine,
            self.mechanism.value,
        )

    def _execute_ddl(self, sql: str, settings: dict[str, Any]) -> None:
        from clickhouse_driver import errors

        try:
            self.client.execute(sql, settings=settings or None)
        except errors.ServerException as e:
            if e.code in (497, 164):  # no CREATE right: fine if the table exists already
                return
            raise

    def _ddl_settings(self) -> dict[str, Any]:
        assert self.version is not None
        if self.version < LOW_CARDINALITY_FLAG_UNTIL and any(
            "LowCardinality(" in c.clickhouse_type for c in self.columns
        ):
            return {"allow_experimental_low_cardinality_type": 1}
        return {}

    def _token_capable(self) -> bool:
        return self.version is not None and self.version >= TOKEN_MIN_VERSION

    def create_table_sql(self) -> str:
        """CREATE TABLE IF NOT EXISTS for the data table: MergeTree, marker column, dedup window on 22.2+."""
        cols = [f"{quote_ident(c.name)} {c.clickhouse_type}" for c in self.columns]
        cols.append(f"{quote_ident(MARKER_COLUMN)} String DEFAULT ''")
        # default: the first column ClickHouse accepts in a sorting key (modern servers refuse Nullable keys)
        keys = self.order_by or [next((c.name for c in self.columns if not strip_type(c.clickhouse_type)[1]), "")]
        order = "tuple()" if keys == [""] else "(" + ", ".join(quote_ident(k) for k in keys) + ")"
        sql = (
            f"CREATE TABLE IF NOT EXISTS {self.full_table} ({', '.join(cols)}) "
            f"ENGINE = MergeTree ORDER BY {order}"
        )
        if self._token_capable():
            sql += f" SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}"
        return sql

    def ledger_sql(self) -> str:
        sql = (
            f"CREATE TABLE IF NOT EXISTS {self.ledger_table} (writer String, batch_id UInt64, chunks UInt32, "
            "rows UInt64, offsets String, state String DEFAULT 'done', written_at DateTime DEFAULT now()) "
            "ENGINE = MergeTree ORDER BY (writer, batch_id)"
        )
        if self._token_capable():
            sql += f" SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}"
        return sql

    # -- ledger

    def committed(self, writer_id: str | None = None) -> LedgerEntry | None:
        """The newest ledger row of a writer (default: this sink's): its batch id and Kafka offsets."""
        self.open()

        def q(_attempt: int) -> LedgerEntry | None:
            rows = self.client.execute(
                f"SELECT batch_id, chunks, rows, offsets FROM {self.ledger_table} WHERE writer = %(w)s "
                "AND state = 'done' ORDER BY batch_id DESC LIMIT 1",
                {"w": writer_id or self.writer_id},
            )
            return (
                LedgerEntry(int(rows[0][0]), int(rows[0][1]), int(rows[0][2]), str(rows[0][3]))
                if rows
                else None
            )

        result: LedgerEntry | None = self._retrying("reading the ledger", q)
        return result

    def committed_offsets(self, writer_id: str | None = None) -> str | None:
        """Offsets of the newest committed batch, for Kafka offset commits and fencing."""
        entry = self.committed(writer_id)
        return entry.offsets if entry else None

    def _ledger_entry(self, batch_id: int) -> tuple[int, int] | None:
        rows = self.client.execute(
            f"SELECT chunks, rows FROM {self.ledger_table} WHERE writer = %(w)s AND batch_id = %(b)s "
            "AND state = 'done' LIMIT 1",
            {"w": self.writer_id, "b": batch_id},
        )
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    def _insert_ledger(self, batch_id: int, chunks: int, rows: int, offsets: str, state: str = "done",
                       writer_id: str | None = None) -> None:
        """A ledger row: ``pending`` before a batch's chunks are sent, ``done`` after, ``rolledback``
        when a successor removed an abandoned batch (see handover.py)."""
        writer = writer_id or self.writer_id
        settings: dict[str, Any] = {}
        if self.mechanism is Mechanism.TOKEN:
            settings = {
                "insert_deduplicate": 1,
                "insert_deduplication_token": f"{writer}/{batch_id}/ledger-{state}",
            }
        self.client.execute(
            f"INSERT INTO {self.ledger_table} (writer, batch_id, chunks, rows, offsets, state) VALUES",
            [[writer], [batch_id], [chunks], [rows], [offsets], [state]],
            columnar=True,
            settings=settings or None,
        )

    # -- hand-over between generations of writers (rescaling; see handover.py)

    def pipeline_ledger(self, writer_prefix: str) -> list[tuple[str, int, str, str]]:
        """(writer, batch_id, state, offsets) of every ledger row of the pipeline's writers: the prefix
        followed by a replica suffix only, so that pipeline ``orders`` never reads ``orders.v2``'s rows."""
        self.open()

        def q(_attempt: int) -> list[tuple[str, int, str, str]]:
            rows = self.client.execute(
                f"SELECT writer, batch_id, state, offsets FROM {self.ledger_table} "
                "WHERE substring(writer, 1, %(n)s) = %(p)s AND match(substring(writer, %(n)s + 1), %(s)s)",
                {"n": len(writer_prefix.encode()), "p": writer_prefix, "s": WRITER_SUFFIX_PATTERN},
            )
            return [(str(w), int(b), str(st), str(o)) for w, b, st, o in rows]

        result: list[tuple[str, int, str, str]] = self._retrying("reading the ledger", q)
        return result

    def roll_back(self, writer_id: str, batch_id: int, offsets: str) -> int:
        """Remove every chunk an abandoned (never done) batch of another writer left in the table.

        Only safe once that writer has stopped for good: the operator stops a generation of replicas
        before it starts the next one. Returns the rows removed.
        """
        self.open()
        prefix = f"{writer_id}/{batch_id}/"
        marker = quote_ident(MARKER_COLUMN)
        where = f"substring({marker}, 1, {len(prefix.encode())}) = %(p)s"

        found: list[int] = []  # rows of the batch seen before the delete was issued
        issued: list[bool] = []

        def remove(_attempt: int) -> None:
            if self._ledger_state(writer_id, batch_id) & {"done", "rolledback"}:
                return
            left = int(self.client.execute(f"SELECT count() FROM {self.full_table} WHERE {where}", {"p": prefix})[0][0])
            if not found:
                found.append(left)
            if left:
                if not issued:
                    log.warning("rolling back %d rows of abandoned batch %s in %s", left, prefix, self.full_table)
                    self.client.execute(f"ALTER TABLE {self.full_table} DELETE WHERE {where}", {"p": prefix})
                    issued.append(True)
                raise _MutationPending(f"waiting for the roll-back of {prefix} to finish")
            self._insert_ledger(batch_id, 0, 0, offsets, state="rolledback", writer_id=writer_id)

        self._retrying(f"rolling back batch {prefix}", remove)
        return found[0] if found else 0

    def _ledger_state(self, writer_id: str, batch_id: int) -> set[str]:
        rows = self.client.execute(
            f"SELECT DISTINCT state FROM {self.ledger_table} WHERE writer = %(w)s AND batch_id = %(b)s",
            {"w": writer_id, "b": batch_id},
        )
        return {str(r[0]) for r in rows}

    # -- chunks in the table (marker mechanism)

    def chunks_present(self, batch_id: int) -> dict[str, int]:
        """marker value -> rows in the table, for every chunk of this batch already stored."""
        prefix = f"{self.writer_id}/{batch_id}/"
        rows = self.client.execute(
            f"SELECT {quote_ident(MARKER_COLUMN)}, count() FROM {self.full_table} "
            f"WHERE substring({quote_ident(MARKER_COLUMN)}, 1, %(n)s) = %(p)s "
            f"GROUP BY {quote_ident(MARKER_COLUMN)}",
            {"n": len(prefix.encode()), "p": prefix},
        )
        return {str(m): int(n) for m, n in rows}

    def _usable_chunks(
        self, batch_id: int, bounds: list[tuple[int, int]], deleting: set[str]
    ) -> dict[str, int]:
        """Chunks of this batch stored completely; partial or stale ones are deleted first (waited for)."""
        present = self.chunks_present(batch_id)
        expected = {marker_value(self.writer_id, batch_id, k): hi - lo for k, (lo, hi) in enumerate(bounds)}
        bad = {m for m, cnt in present.items() if expected.get(m) != cnt}
        if bad:
            if not bad <= deleting:
                self._delete_markers(bad - deleting)
                deleting |= bad
            raise _MutationPending(f"waiting for the delete of chunks {sorted(bad)} to finish")
        return present

    def _delete_markers(self, markers: Iterable[str]) -> None:
        """Remove partially stored or stale chunks (a server crash mid-insert, or a changed maxRows)."""
        markers = sorted(markers)
        log.warning(
            "deleting partial/stale chunks %s from %s before rewriting them", markers, self.full_table
        )
        self.client.execute(
            f"ALTER TABLE {self.full_table} DELETE WHERE {quote_ident(MARKER_COLUMN)} IN %(m)s",
            {"m": tuple(markers)},
        )

    # -- writing

    def write_batch(self, batch_id: int, data: Mapping[str, Sequence[Any]], offsets: str) -> WriteResult:
        """Write one micro-batch exactly once: a replay of a committed (writer_id, batch_id) is skipped."""
        self.open()
        n = self._check_data(data)
        committed = self._retrying("looking up the ledger", lambda _a: self._ledger_entry(batch_id))
        if committed is not None:
            log.info(
                "batch %d of %s is in the ledger already (%d rows): replay skipped",
                batch_id,
                self.writer_id,
                committed[1],
            )
            return WriteResult(0, committed[0], True)

        bounds = chunk_bounds(n, self.max_rows)
        raw = [data[c.name] for c in self.columns]
        if len(bounds) > 1:  # make chunk k the same rows on a replay, whatever order Spark produced them in
            order = canonical_order(raw)
            raw = [[col[i] for i in order] for col in raw]
        converted = [
            convert_column(c.name, self.table_types[c.name], col)
            for c, col in zip(self.columns, raw, strict=True)
        ]
        names = [c.name for c in self.columns]
        with_marker = self.has_marker
        if with_marker:
            names.append(MARKER_COLUMN)
        insert_sql = f"INSERT INTO {self.full_table} ({', '.join(quote_ident(x) for x in names)}) VALUES"

        done: set[int] = set()  # chunks this call saw acknowledged
        sent: set[int] = set()  # chunks this call sent an INSERT for (acknowledged or not)
        deleting: set[str] = set()  # partial/stale chunks whose delete was issued
        stats = {"written": 0, "skipped": 0, "attempts": 0}
        check_first = self._fresh

        def attempt(k_attempt: int) -> None:
            stats["attempts"] = k_attempt + 1
            if k_attempt > 0 and self._ledger_entry(batch_id) is not None:
                return  # the ledger insert of a previous attempt landed; only its answer was lost
            if k_attempt == 0:
                # Announce the batch and its offsets before any chunk: a successor that takes over these
                # partitions after this writer is gone can find and roll back what a crash left behind.
                self._insert_ledger(batch_id, len(bounds), n, offsets, state="pending")
            present: dict[str, int] = {}
            if self.mechanism is Mechanism.MARKER and (check_first or k_attempt > 0):
                present = self._usable_chunks(batch_id, bounds, deleting)
            for k, (lo, hi) in enumerate(bounds):
                marker = marker_value(self.writer_id, batch_id, k)
                if k in done:
                    continue
                if marker in present:
                    if k in sent:  # our own INSERT landed; only its answer was lost
                        stats["written"] += hi - lo
                    else:  # a crashed predecessor wrote it
                        stats["skipped"] += 1
                    done.add(k)
                    continue
                sent.add(k)
                cols = [col[lo:hi] for col in converted]  # fresh lists: the driver rewrites them in place
                if with_marker:
                    cols.append([marker] * (hi - lo))
                settings: dict[str, Any] = {"insert_block_size": max(hi - lo, 1)}
                if self.mechanism is Mechanism.TOKEN:
                    settings.update(insert_deduplicate=1, insert_deduplication_token=marker)
                self.client.execute(insert_sql, cols, columnar=True, settings=settings)
                done.add(k)
                stats["written"] += hi - lo
            self._insert_ledger(batch_id, len(bounds), n, offsets)

        self._fresh = True
        self._retrying(f"writing batch {batch_id} to {self.full_table}", attempt)
        self._fresh = False
        if stats["skipped"]:
            log.warning(
                "batch %d: %d chunk(s) were already in %s (written before a crash) and were skipped",
                batch_id,
                stats["skipped"],
                self.full_table,
            )
        return WriteResult(stats["written"], len(bounds), False, stats["skipped"], stats["attempts"])

    def _check_data(self, data: Mapping[str, Sequence[Any]]) -> int:
        names = {c.name for c in self.columns}
        missing = names - data.keys()
        extra = set(data.keys()) - names
        if missing or extra:
            raise SinkError(
                f"batch columns do not match the sink's: missing {sorted(missing)}, extra {sorted(extra)}"
            )
        lengths = {len(data[c.name]) for c in self.columns}
        if len(lengths) > 1:
            raise SinkError(f"batch columns have different lengths: {sorted(lengths)}")
        return lengths.pop()
