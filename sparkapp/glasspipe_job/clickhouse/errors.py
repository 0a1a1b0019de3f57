"""Which ClickHouse errors are worth retrying, and a fix for the permanent ones."""

from __future__ import annotations

import ssl

from glasspipe_job.clickhouse.names import LEDGER_TABLE, full_name, quote_ident

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

# What the sink's user needs (docs/exactly-once.md lists each statement): a roll-back deletes chunks.
_SINK_RIGHTS = ("INSERT, SELECT, ALTER DELETE ON {table} and CREATE TABLE, INSERT, SELECT ON {database}."
                + LEDGER_TABLE)

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
    164: f"the user is read-only (its profile's readonly setting): the sink's user needs {_SINK_RIGHTS} "
    "(docs/exactly-once.md lists each right)",
    192: "unknown user: fix the user name in the Secret of spec.sink.clickhouse.userSecretRef",
    193: "wrong password: fix the password in the Secret of spec.sink.clickhouse.passwordSecretRef",
    194: "password required: set spec.sink.clickhouse.passwordSecretRef",
    195: "the user may not connect from this address: allow the Spark pods' network for it",
    497: f"access denied: GRANT {_SINK_RIGHTS} to the sink's user (docs/exactly-once.md lists each right)",
    516: "authentication failed: fix the Secrets of spec.sink.clickhouse.userSecretRef and passwordSecretRef",
}


class SinkError(Exception):
    """A write that will not succeed by retrying: the message names the table/column and the fix."""


class SinkUnavailable(SinkError):
    """ClickHouse stayed unreachable/overloaded past the configured retry deadline."""


class MutationPending(Exception):
    """A delete of partially written chunks is still running; treated as transient."""


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
        | MutationPending,
    )


def describe_error(exc: BaseException, database: str, table: str, where: str | None = None) -> str:
    """A one-paragraph explanation of a permanent error: what failed (``where``, default: writing to the
    table) and how to fix it."""
    code = getattr(exc, "code", None)
    raw = str(getattr(exc, "message", None) or exc).strip()
    first = raw.splitlines()[0] if raw else type(exc).__name__
    first = first.split(" Stack trace:")[0].replace("DB::Exception: ", "").rstrip(". ")
    full = full_name(database, table)
    fix = _FIXES.get(code) if isinstance(code, int) else None
    if code == 252:
        fix = (
            "one micro-batch touches more partitions than max_partitions_per_insert_block allows: lower "
            "spec.sink.clickhouse.batching.maxRows, coarsen the table's PARTITION BY, or raise the setting"
        )
    if "certificate verify failed" in raw.lower():
        fix = ("the server's TLS certificate could not be verified: put the CA that signed it in the Secret of "
               "spec.sink.clickhouse.caSecretRef")
    where = where or f"writing to ClickHouse table {full}"
    text = (
        f"{where} failed: {type(exc).__name__} (code {code}): {first}" if code else f"{where} failed: {first}"
    )
    if fix:
        text += ". Fix: " + fix.format(database=quote_ident(database), table=full)
    return text
