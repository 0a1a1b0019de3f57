"""bench/plot.py's choice of a latency axis for runs by minute (no matplotlib needed)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from plot import latency_scale


def by_minute(*p50_p99: tuple[float, float]) -> dict[str, object]:
    return {"by_minute": [[m, p50, p50 * 1.2, p99] for m, (p50, p99) in enumerate(p50_p99)]}


def test_runs_that_held_keep_a_linear_axis() -> None:
    held = by_minute((1.1, 1.8), (1.2, 2.1), (1.3, 4.9))
    other = by_minute((1.0, 1.6), (1.4, 3.7))
    assert latency_scale([held, other]) == "linear"


def test_a_run_far_behind_beside_one_that_held_gets_a_log_axis() -> None:
    held = by_minute((1.1, 1.7), (1.3, 4.6))
    behind = by_minute((1.7, 3.0), (40.0, 60.0), (88.8, 95.4))
    assert latency_scale([held, behind]) == "log"
    assert latency_scale([held]) == "linear"


def test_a_p99_spike_alone_keeps_the_linear_axis() -> None:
    spiked = by_minute((1.2, 2.0), (2.7, 30.0), (1.3, 2.4))
    assert latency_scale([spiked]) == "linear"
