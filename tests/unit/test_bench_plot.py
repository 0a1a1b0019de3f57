"""bench/plot.py's choices made before drawing (no matplotlib needed): the latency axis for runs by minute, and the
latency panels by variant."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from plot import latency_panels, latency_scale, sustained_runs


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


def run(variant: str, offered: float) -> dict[str, object]:
    """A run that kept up by freshness_runs.kept_up: all landed, exact, latency flat, the backlog gone at once."""
    return {"variant": variant, "offered": offered, "seconds": 180, "exact": True, "first_fifth": 1.0,
            "last_fifth": 1.0, "drained": 0.5, "p50": 1.0, "p95": 1.5, "p99": 2.0}


def test_a_matrix_at_fixed_rates_gets_a_panel_a_rate_then_the_sustained_one() -> None:
    runs = [run(v, r) for v in ("plain", "dedup") for r in (1_000, 10_000)] + [run("dedup", 40_000)]
    panels = latency_panels(runs, sustained_runs(runs))
    assert [(title, sorted(v for v, _ in by), fixed) for title, by, fixed in panels] == [
        ("1,000/s offered", ["dedup", "plain"], True),
        ("10,000/s offered", ["dedup", "plain"], True),
        ("each one's sustained rate", ["dedup", "plain"], False),
    ]
    assert panels[2][1][("dedup", 1)]["offered"] == 40_000


def test_a_sustained_rate_search_gets_only_the_sustained_panel() -> None:
    runs = [run("join", 20_000), run("join", 30_000), run("dedup-own", 50_000)]
    panels = latency_panels(runs, sustained_runs(runs))
    assert [(title, fixed) for title, _, fixed in panels] == [("each one's sustained rate", False)]
    assert panels[0][1][("join", 1)]["offered"] == 30_000
