"""bench/freshness_runs.py's search for the sustained rate (freshness.py --find-sustained): which rates it runs for
a pipeline whose true edge is known, and what it reports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from freshness_runs import SustainedSearch


def searched(search: SustainedSearch, edge: float) -> list[float]:
    """Every rate the search runs against a pipeline that keeps up at ``edge`` events/s and below."""
    for rate in search.rates():
        search.record(rate, rate <= edge)
    return [rate for rate, _ in search.tried]


def test_steps_up_until_a_run_falls_behind_then_halves_the_last_step() -> None:
    search = SustainedSearch(60_000, 20_000, refine=1)
    assert searched(search, edge=95_000) == [60_000, 80_000, 100_000, 90_000]
    assert (search.held, search.failed) == (90_000, 100_000)
    assert search.verdict() == ("sustained: 90000 events/s, the highest offered rate that kept up; 100000 did not "
                                "(60000 held, 80000 held, 100000 behind, 90000 held)")


def test_steps_down_while_nothing_kept_up() -> None:
    search = SustainedSearch(100_000, 20_000, refine=2)
    assert searched(search, edge=47_000) == [100_000, 80_000, 60_000, 40_000, 50_000, 45_000]
    assert (search.held, search.failed) == (45_000, 50_000)


def test_refinement_stops_at_the_grain() -> None:
    search = SustainedSearch(10_000, 1_000, refine=3)
    assert searched(search, edge=11_500) == [10_000, 11_000, 12_000]  # the middle, 11 500, rounds onto an end


def test_no_refinement_reports_the_bracket_of_whole_steps() -> None:
    search = SustainedSearch(40_000, 10_000, refine=0)
    assert searched(search, edge=55_000) == [40_000, 50_000, 60_000]
    assert search.verdict().startswith("sustained: 50000 events/s")


def test_a_pipeline_that_keeps_up_at_no_rate_ends_the_search() -> None:
    search = SustainedSearch(30_000, 10_000)
    assert searched(search, edge=0) == [30_000, 20_000, 10_000]
    assert search.held is None
    assert search.verdict("pairs/s") == "sustained: no rate kept up (30000 behind, 20000 behind, 10000 behind)"


@pytest.mark.parametrize("start, step, refine", [(0, 1000, 1), (1000, 0, 1), (1000, 1000, -1)])
def test_a_search_without_a_rate_or_a_step_is_refused(start: float, step: float, refine: int) -> None:
    with pytest.raises(ValueError, match="first rate and a step above 0"):
        SustainedSearch(start, step, refine)
