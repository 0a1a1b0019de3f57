"""What the sink writes into ClickHouse besides the rows: the marker column, the ledger table, chunk markers."""

from __future__ import annotations

MARKER_COLUMN = "_glasspipe_batch"
LEDGER_TABLE = "glasspipe_ledger"


def quote_ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def full_name(database: str, table: str) -> str:
    return f"{quote_ident(database)}.{quote_ident(table)}"


def batch_prefix(writer_id: str, batch_id: int) -> str:
    """What every chunk marker of one batch starts with."""
    return f"{writer_id}/{batch_id}/"


def marker_value(writer_id: str, batch_id: int, lo: int, hi: int) -> str:
    """The marker column value and the deduplication token of the chunk of rows [lo, hi) of a batch (in its
    canonical order). The boundaries, not a chunk number, identify it: after a restart with another
    ``maxRows`` a stored chunk of the same size but other rows must not pass for a chunk of the new split."""
    return f"{batch_prefix(writer_id, batch_id)}{lo}-{hi}"
