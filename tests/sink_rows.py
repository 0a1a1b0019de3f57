"""Rows, columns and checks shared by the ClickHouse sink's integration tests."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from glasspipe.api.validation import OutputColumn
from glasspipe_dev.clickhouse import ClickHouseServer

COLS = [
    OutputColumn("id", "`id`", "Int64", "s.id"),
    OutputColumn("key", "`key`", "String", "s.key"),
    OutputColumn("ts", "`ts`", "DateTime", "s.ts"),
    OutputColumn("v", "`v`", "Nullable(Float64)", "s.v"),
]
T0 = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)


def rows(lo: int, hi: int, shuffle: int | None = None) -> dict[str, list[Any]]:
    ids = list(range(lo, hi))
    if shuffle is not None:  # a replay may bring the same rows in another order
        random.Random(shuffle).shuffle(ids)
    return {
        "id": ids,
        "key": [f"k{i % 97}" for i in ids],
        "ts": [T0 + dt.timedelta(seconds=i) for i in ids],
        "v": [None if i % 10 == 0 else i / 4 for i in ids],
    }


def stats(server: ClickHouseServer, table: str) -> tuple[int, int]:
    """(rows, distinct ids) of a table: equal when nothing was written twice."""
    ((n, uniq),) = server.client().execute(f"SELECT count(), uniqExact(id) FROM {table}")
    return int(n), int(uniq)


class Crash(BaseException):
    """Stands for the driver process dying: not an Exception, so the sink does not retry it."""
