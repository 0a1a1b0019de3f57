"""bench/job_log.py's cost by fifth: a pipeline behind takes larger batches, and their cost a row, not their
length, says whether the work grew."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from job_log import JobLog


def log_of(batches: list[tuple[int, float]]) -> JobLog:
    """A log of (input rows, triggerExecution ms) a batch, numbered from 0."""
    return JobLog([(i, n, {"triggerExecution": ms}) for i, (n, ms) in enumerate(batches)], {})


def test_larger_batches_at_one_cost_a_row_read_flat() -> None:
    # caught behind: the last fifth's batches are five times as large and as long
    costs = log_of([(50_000, 1_000.0)] * 8 + [(250_000, 5_000.0)] * 2).cost_by_fifth(0)
    assert [round(us, 1) for us, _ in costs] == [20.0] * 5
    assert [rows for _, rows in costs] == [50_000] * 4 + [250_000]


def test_a_cost_a_row_that_grew_shows_in_its_fifth_and_empty_batches_do_not_count() -> None:
    batches = [(50_000, 1_000.0)] * 8 + [(0, 30.0)] * 3 + [(50_000, 1_500.0)] * 2
    costs = log_of(batches).cost_by_fifth(0)
    assert [round(us, 1) for us, _ in costs] == [20.0, 20.0, 20.0, 20.0, 30.0]


def test_batches_before_the_first_measured_or_too_few_give_nothing_by_fifth() -> None:
    log = log_of([(50_000, 1_000.0)] * 6)
    assert log.cost_by_fifth(2) == []
    assert len(log.cost_by_fifth(1)) == 5


def test_the_cost_a_row_by_live_keys_counts_the_keys_before_each_batch() -> None:
    # 40 rows a batch, a quarter of them first occurrences: 10 new keys a batch, 80 keys after the 8 batches
    batches = [(40, 400.0)] * 4 + [(40, 800.0)] * 3 + [(0, 50.0)] + [(40, 1_200.0)]
    by_keys = log_of(batches).cost_by_live_keys(firsts=80, step=30)
    # keys before the batches: 0, 10, 20 | 30, 40, 50 | 60, 70 (the empty batch reads nothing and does not count)
    assert by_keys == [(30, 10_000.0), (60, 1000 * 2_000.0 / 120), (90, 1000 * 2_000.0 / 80)]


def test_a_state_that_grew_by_one_batch_is_one_step() -> None:
    assert log_of([(50_000, 1_000.0)]).cost_by_live_keys(firsts=45_000) == [(10_000_000, 20.0)]
