"""bench/freshness_runs.py's "kept up" rule, which decides the sustained rates docs/benchmarks.md reports: a run that
fell behind for minutes and caught up before its last fifth did not keep up."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from freshness_runs import kept_up, worst_minute_rise


def run(medians: list[float] | None, seconds: float = 600.0, **over: Any) -> dict[str, Any]:
    """A run's figures as freshness.py writes them: every first occurrence landed, exact, drained at once; its
    minutes (p50 / p95 / p99) where ``medians`` is given."""
    fifth = len(medians) // 5 if medians else 0
    figures: dict[str, Any] = {
        "seconds": seconds, "firsts": 1000, "firsts_seen": 1000, "exact": True, "drained": 1.0, "p99": 2.0,
        "first_fifth": sorted(medians[:fifth])[fifth // 2] if medians else 1.2,
        "last_fifth": sorted(medians[-fifth:])[fifth // 2] if medians else 1.3,
    }
    if medians is not None:
        figures["by_minute"] = [[m, p50, p50 * 1.5, p50 * 2] for m, p50 in enumerate(medians)]
    return {**figures, **over}


def test_a_flat_run_kept_up() -> None:
    flat = run([1.2, 1.1, 1.3, 1.2, 1.25, 1.2, 1.4, 1.3, 1.2, 1.3])
    assert worst_minute_rise(flat) == pytest.approx(0.2)
    assert kept_up(flat)


def test_minutes_behind_in_the_middle_are_not_kept_up_though_the_fifths_agree() -> None:
    behind = run([1.2, 1.2, 1.3, 1.2, 4.8, 6.3, 1.4, 1.3, 1.2, 1.3])
    assert behind["last_fifth"] - behind["first_fifth"] < 0.5  # the fifths alone would pass it
    assert worst_minute_rise(behind) == pytest.approx(5.1)
    assert not kept_up(behind)


def test_a_last_minute_cut_short_by_the_runs_end_does_not_count() -> None:
    # one event in the eleventh minute: it weighs nothing in the last fifth
    tail = run([1.2, 1.2, 1.3, 1.2, 1.2, 1.2, 1.3, 1.2, 1.2, 1.3, 9.0], seconds=600.2, last_fifth=1.25)
    assert worst_minute_rise(tail) == pytest.approx(0.1)
    assert kept_up(tail)


def test_a_run_without_its_minutes_is_judged_by_its_fifths() -> None:
    assert kept_up(run(None))
    assert not kept_up(run(None, last_fifth=1.9))
    assert not kept_up(run(None, firsts_seen=999))
    assert not kept_up(run(None, drained=7.0))
