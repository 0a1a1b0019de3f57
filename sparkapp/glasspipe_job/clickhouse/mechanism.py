"""How a table is written exactly once: a marker column (every version) or deduplication tokens (22.2+).

* ``marker``: the data table has a ``_glasspipe_batch String`` column holding ``"{writer_id}/{batch_id}/{chunk}"``.
  A chunk is sent as exactly ONE native-protocol block, which the server stores all-or-nothing when the
  client dies (bench/clickhouse_experiments.py). Chunks already in the table are counted and skipped.
* ``token``: ``insert_deduplication_token`` per chunk on a Replicated table or a MergeTree with
  ``non_replicated_deduplication_window``; the server drops a re-sent chunk itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum

from glasspipe_job.clickhouse.errors import SinkError
from glasspipe_job.clickhouse.names import MARKER_COLUMN

# insert_deduplication_token appeared in 22.2 (ClickHouse changelog 2022); below it only the marker works.
TOKEN_MIN_VERSION = (22, 2)
# Size of the deduplication window of tables the sink creates on servers with tokens.
DEDUP_WINDOW = 10_000


class Mechanism(StrEnum):
    MARKER = "marker"
    TOKEN = "token"


def parse_version(text: str) -> tuple[int, ...]:
    """'18.16.1' -> (18, 16, 1); '24.8.4.13' -> (24, 8, 4, 13)."""
    m = re.match(r"\s*(\d+(?:\.\d+)*)", text)
    if not m:
        raise SinkError(f"cannot parse the ClickHouse version {text!r}")
    return tuple(int(p) for p in m.group(1).split("."))


def token_capable(version: Sequence[int] | None) -> bool:
    return version is not None and tuple(version) >= TOKEN_MIN_VERSION


def choose_mechanism(
    version: Sequence[int], engine: str, engine_full: str, has_marker: bool, table: str
) -> Mechanism:
    """The exactly-once mechanism this table on this server version supports, or SinkError saying why none."""
    if "MergeTree" not in engine:
        raise SinkError(
            f"table {table} has engine {engine}; glasspipe writes exactly once only into MergeTree tables "
            "(write into the local MergeTree table, not a Distributed, Buffer or other engine)"
        )
    if token_capable(version):
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
