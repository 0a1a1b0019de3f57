"""The data table and the ledger table on one server: created when asked, inspected, mechanism chosen."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from glasspipe.api.validation import parse_clickhouse_type
from glasspipe_job.clickhouse.connection import Connection
from glasspipe_job.clickhouse.errors import SinkError, describe_error
from glasspipe_job.clickhouse.mechanism import DEDUP_WINDOW, Mechanism, choose_mechanism, parse_version, token_capable
from glasspipe_job.clickhouse.mutations import MutationStuck, MutationWatch
from glasspipe_job.clickhouse.names import LEDGER_TABLE, MARKER_COLUMN, full_name, quote_ident

log = logging.getLogger(__name__)

# LowCardinality needs allow_experimental_low_cardinality_type=1 before it went GA in 19.x; the setting
# is an obsolete no-op later, so it is only sent to servers that need it.
LOW_CARDINALITY_FLAG_UNTIL = (19, 3)


class SinkColumn(Protocol):
    """What the sink needs of an output column (glasspipe.api.validation.OutputColumn has it)."""

    @property
    def name(self) -> str: ...

    @property
    def clickhouse_type(self) -> str: ...


# A left join's done batch: every left record with an event time (ms) at or before it had its window closed by then
# (the batch's watermark minus the join window), so the writer wrote it, matched or with NULLs; 0: none or unknown.
# A successor's hand-over reads it (handover.closed_windows). Added to ledgers created before it
# (ClickHouseTable._open).
CLOSED_COLUMN = "left_closed_ms Int64 DEFAULT 0"


def ledger_sql(ledger_table: str, with_dedup_window: bool) -> str:
    """CREATE TABLE IF NOT EXISTS for the ledger (rows: see ledger.py)."""
    sql = (
        f"CREATE TABLE IF NOT EXISTS {ledger_table} (writer String, batch_id UInt64, chunks UInt32, "
        "rows UInt64, offsets String, state String DEFAULT 'done', written_at DateTime DEFAULT now(), "
        f"{CLOSED_COLUMN}) "
        "ENGINE = MergeTree ORDER BY (writer, batch_id)"
    )
    if with_dedup_window:
        sql += f" SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}"
    return sql


def create_table_sql(full_table: str, columns: Sequence[SinkColumn], order_by: Sequence[str] | None,
                     with_dedup_window: bool) -> str:
    """CREATE TABLE IF NOT EXISTS for the data table: MergeTree, marker column, dedup window on 22.2+."""
    cols = [f"{quote_ident(c.name)} {c.clickhouse_type}" for c in columns]
    cols.append(f"{quote_ident(MARKER_COLUMN)} String DEFAULT ''")
    # default: the first column ClickHouse accepts in a sorting key (modern servers refuse Nullable keys)
    keys = list(order_by or []) or [
        next((c.name for c in columns if not parse_clickhouse_type(c.clickhouse_type).nullable), "")]
    order = "tuple()" if keys == [""] else "(" + ", ".join(quote_ident(k) for k in keys) + ")"
    sql = f"CREATE TABLE IF NOT EXISTS {full_table} ({', '.join(cols)}) ENGINE = MergeTree ORDER BY {order}"
    if with_dedup_window:
        sql += f" SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}"
    return sql


def ddl_settings(version: Sequence[int], columns: Sequence[SinkColumn]) -> dict[str, Any]:
    if tuple(version) < LOW_CARDINALITY_FLAG_UNTIL and any("LowCardinality(" in c.clickhouse_type for c in columns):
        return {"allow_experimental_low_cardinality_type": 1}
    return {}


class ClickHouseTable:
    """One data table (and the database's ledger table) as the sink writes them.

    open() detects the server version, creates the tables when asked, checks the output columns against
    the table's and chooses the exactly-once mechanism; until then nothing talks to the server.
    """

    def __init__(self, connection: Connection, table: str, columns: Sequence[SinkColumn],
                 create_table: bool = False, order_by: Sequence[str] | None = None) -> None:
        if not columns:
            raise ValueError("at least one output column is needed")
        names = [c.name for c in columns]
        if len(set(names)) != len(names) or MARKER_COLUMN in names:
            raise ValueError(f"column names must be unique and not {MARKER_COLUMN!r}: {names}")
        self.connection = connection
        self.database = connection.database
        self.table = table
        self.columns = list(columns)
        self.create_table = create_table
        self.order_by = list(order_by) if order_by else None
        self.version: tuple[int, ...] | None = None
        self.mechanism: Mechanism | None = None
        self.table_types: dict[str, str] = {}
        self.has_marker = False
        self.ledger_has_closed = False  # the ledger has CLOSED_COLUMN
        self.stuck: MutationStuck | None = None  # the last DELETE that passed the mutation deadline (runner.py)

    @property
    def full_table(self) -> str:
        return full_name(self.database, self.table)

    @property
    def ledger_table(self) -> str:
        return full_name(self.database, LEDGER_TABLE)

    def retrying(self, what: str, fn: Callable[[int], Any]) -> Any:
        """connection.retrying, with permanent errors explained for this table."""
        return self.connection.retrying(what, fn, lambda e: describe_error(e, self.database, self.table))

    def mutation_watch(self, what: str) -> MutationWatch:
        """A deadline-bounded wait for a DELETE on the data table (see mutations.py)."""
        return MutationWatch(lambda: self.connection.client, self.database, self.table, self.full_table, what,
                             self.connection.mutation_deadline, self.connection.clock, self._stuck)

    def _stuck(self, error: MutationStuck) -> None:
        self.stuck = error

    def create_table_sql(self) -> str:
        return create_table_sql(self.full_table, self.columns, self.order_by, token_capable(self.version))

    def ledger_sql(self) -> str:
        return ledger_sql(self.ledger_table, token_capable(self.version))

    def close(self) -> None:
        self.connection.close()

    def open(self) -> ClickHouseTable:
        """Inspect the server and the table once (retried); later calls return at once."""
        if self.mechanism is None:
            self.retrying("opening the sink", lambda _attempt: self._open())
        return self

    def _open(self) -> None:
        c = self.connection.client
        self.version = parse_version(str(c.execute("SELECT version()")[0][0]))
        if self.create_table:
            self._execute_ddl(self.create_table_sql(), ddl_settings(self.version, self.columns))
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
        self.ledger_has_closed = self._ledger_closed_column()
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
        self._check_columns()
        marker_type = self.table_types.get(MARKER_COLUMN)
        if marker_type is not None and parse_clickhouse_type(marker_type).inner != "String":
            raise SinkError(
                f"column {MARKER_COLUMN} of {self.full_table} is {marker_type}; it must be String. Fix: "
                f"ALTER TABLE {self.full_table} MODIFY COLUMN {MARKER_COLUMN} String DEFAULT ''"
            )
        self.has_marker = marker_type is not None
        engine, engine_full = c.execute(
            "SELECT engine, engine_full FROM system.tables WHERE database = %(db)s AND name = %(t)s",
            {"db": self.database, "t": self.table},
        )[0]
        self.mechanism = choose_mechanism(self.version, str(engine), str(engine_full), self.has_marker,
                                          self.full_table)
        log.info("ClickHouse %s, table %s (%s): exactly-once by %s", ".".join(map(str, self.version)),
                 self.full_table, engine, self.mechanism.value)

    def _ledger_closed_column(self) -> bool:
        """Whether the ledger has CLOSED_COLUMN, adding it to a ledger created before it. Without it (the sink's
        user may not ALTER the ledger) batches are committed as before, and a left join's hand-over cannot tell
        which re-read rows were written already (docs/semantics.md)."""
        from clickhouse_driver import errors

        c = self.connection.client
        name = CLOSED_COLUMN.split()[0]
        args = {"db": self.database, "t": LEDGER_TABLE, "c": name}
        has = "SELECT count() FROM system.columns WHERE database = %(db)s AND table = %(t)s AND name = %(c)s"
        if c.execute(has, args)[0][0]:
            return True
        try:  # (IF NOT EXISTS is newer than some servers glasspipe supports)
            c.execute(f"ALTER TABLE {self.ledger_table} ADD COLUMN {CLOSED_COLUMN}")
        except errors.ServerException as e:
            if e.code == 15:  # DUPLICATE_COLUMN: another replica added it just now
                return True
            if e.code not in (497, 164):  # no ALTER right
                raise
            log.warning("the ledger %s has no column %s and the sink's user may not add it: a left join's "
                        "rescale may write unmatched rows of its last window twice. Fix: ALTER TABLE %s ADD COLUMN "
                        "%s", self.ledger_table, name, self.ledger_table, CLOSED_COLUMN)
            return False
        return True

    def _check_columns(self) -> None:
        missing = [col for col in self.columns if col.name not in self.table_types]
        if missing:
            adds = "; ".join(
                f"ALTER TABLE {self.full_table} ADD COLUMN {quote_ident(col.name)} {col.clickhouse_type}"
                for col in missing
            )
            raise SinkError(
                f"ClickHouse table {self.full_table} lacks column(s) {', '.join(col.name for col in missing)}. "
                f"Fix: {adds} (or fix the column names in spec.sink.clickhouse.columns)"
            )
        for col in self.columns:
            if self.table_types[col.name].replace(" ", "") != col.clickhouse_type.replace(" ", ""):
                log.warning("column %s is %s in %s, the spec says %s: values are converted for the table's type",
                            col.name, self.table_types[col.name], self.full_table, col.clickhouse_type)

    def _execute_ddl(self, sql: str, settings: dict[str, Any]) -> None:
        from clickhouse_driver import errors

        try:
            self.connection.client.execute(sql, settings=settings or None)
        except errors.ServerException as e:
            if e.code in (497, 164):  # no CREATE right: fine if the table exists already
                return
            raise
