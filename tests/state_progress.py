"""A streaming query's state rows as its progress reports them (the operator tests of the dedup and the join)."""

from __future__ import annotations

import time
from typing import Any


def state_rows(query: Any) -> int:
    """Rows in the first stateful operator's state (``numRowsTotal``; timers not counted) after the last batch that
    reported one. Spark counts them only with ``glasspipe.contract.STATE_ROW_COUNT_CONF`` on."""
    for p in reversed(query.recentProgress):
        if p.get("stateOperators"):
            return int(p["stateOperators"][0]["numRowsTotal"])
    raise AssertionError("no state operator progress")


def wait_state_rows(query: Any, expected: int, timeout: float = 60.0) -> None:
    """Eviction happens in the no-data batch Spark runs after the watermark moved, which may start after
    processAllAvailable() returned: poll the progress until it shows up."""
    deadline = time.monotonic() + timeout
    while state_rows(query) != expected:
        if time.monotonic() > deadline:
            summary = [(p["batchId"], p["numInputRows"], p["eventTime"].get("watermark"),
                        p["stateOperators"][0]["numRowsTotal"] if p["stateOperators"] else None)
                       for p in query.recentProgress]
            raise AssertionError(f"state rows {state_rows(query)} != {expected} after {timeout} s: {summary}")
        time.sleep(0.2)
