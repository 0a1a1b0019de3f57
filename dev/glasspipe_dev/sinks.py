"""A ClickHouse sink from connection settings, for tests and benchmarks that write without a pipeline spec (the
job builds its table from the spec: runner.make_table)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from glasspipe_job.clickhouse.connection import Connection
from glasspipe_job.clickhouse.sink import ClickHouseSink
from glasspipe_job.clickhouse.table import ClickHouseTable, SinkColumn


def sink_from_settings(hosts: Sequence[str], database: str, table: str, columns: Sequence[SinkColumn],
                       writer_id: str, max_rows: int = 100_000, *, create_table: bool = False,
                       order_by: Sequence[str] | None = None, **connection: Any) -> ClickHouseSink:
    """The writer ``writer_id`` of ``database.table`` on ``hosts``; ``connection``: Connection's keywords (user,
    password, retry_deadline, client_factory, ...). Inserts go in blocks of ``max_rows``, as in the job."""
    conn = Connection(hosts, database, insert_block_size=max_rows, **connection)
    return ClickHouseSink(ClickHouseTable(conn, table, columns, create_table, order_by), writer_id, max_rows)
