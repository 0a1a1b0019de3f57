"""bench/landed_rows.py's bookkeeping, which every latency figure in docs/benchmarks.md comes from: which rows the
poller counts as landed and when, how far its ``seq > low`` query may skip, and the percentiles of the latencies."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path
from typing import Any, cast

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from landed_rows import Poller, by_minute, first_gap, quantile, trend
from summary_stats import percentile


class NoServer:
    """What Poller's constructor asks of a ClickHouseServer; the tests feed it polls through ``_saw``."""

    def client(self) -> None:
        return None


def poller() -> Poller:
    return Poller(cast(Any, NoServer()), "t")


def seen(*seqs: int, size: int = 32) -> np.ndarray:
    marks = np.zeros(size, dtype=bool)
    marks[list(seqs)] = True
    return marks


def test_first_gap_stops_before_the_first_seq_not_seen() -> None:
    assert first_gap(seen(1, 2, 3, 4, 5, 7), 0) == 5
    assert first_gap(seen(1, 2, 3, 4, 5, 7), 0, chunk=2) == 5  # across chunks
    assert first_gap(seen(1, 2, 3), 3) == 3  # nothing new after low
    assert first_gap(seen(*range(1, 32)), 0, chunk=4) == 31  # all seen: the array's last


def test_a_poll_counts_each_first_occurrence_once_with_its_latency() -> None:
    p = poller()
    # seq 2 comes twice in one poll (a row stored twice): counted once, at its first row's sent time
    p._saw(np.array([3, 1, 2, 2]), np.array([9.0, 8.0, 8.5, 9.5]), at=10.0)
    assert (p.rows, p.low) == (3, 3)
    p._saw(np.array([2, 5]), np.array([8.5, 9.0]), at=11.0)  # 2 again: not new; 4 missing: low stays
    assert (p.rows, p.low) == (4, 3)
    p._saw(np.array([4]), np.array([10.0]), at=11.5)
    assert (p.rows, p.low) == (5, 5)
    latency, sent = p.values(since=0.0)
    pairs = sorted(zip(sent.tolist(), latency.tolist(), strict=True))
    assert pairs == [(8.0, 2.0), (8.5, 1.5), (9.0, 1.0), (9.0, 2.0), (10.0, 1.5)]


def test_values_leave_out_rows_sent_before_the_measured_window() -> None:
    p = poller()
    p._saw(np.array([1, 2, 3]), np.array([99.5, 100.0, 100.2]), at=101.0)
    latency, sent = p.values(since=100.0)
    assert sent.tolist() == [100.0, 100.2] and np.allclose(latency, [1.0, 0.8])


def test_the_seen_marks_grow_past_their_first_size() -> None:
    p = poller()
    top = 3 << 20
    p._saw(np.array([1, top]), np.array([1.0, 1.0]), at=2.0)
    assert len(p.seen) > top and p.rows == 2 and p.low == 1


def test_quantile_is_summary_stats_percentile() -> None:
    rng = random.Random(7)
    for n in (1, 2, 5, 100, 1001):
        values = [rng.uniform(0, 10) for _ in range(n)]
        for q in (0.0, 0.5, 0.95, 0.99, 1.0):
            assert quantile(np.array(values), q) == percentile(values, q)
    assert math.isnan(quantile(np.zeros(0), 0.5))


def test_by_minute_groups_rows_by_the_minute_they_were_sent() -> None:
    sent = np.array([1000.0, 1030.0, 1059.9, 1060.0, 1150.0])
    latency = np.array([1.0, 2.0, 3.0, 7.0, 5.0])
    assert by_minute(sent, latency) == {0: (2.0, 3.0, 3.0), 1: (7.0, 7.0, 7.0), 2: (5.0, 5.0, 5.0)}
    assert by_minute(np.zeros(0), np.zeros(0)) == {}


def test_trend_compares_the_first_fifth_with_the_last() -> None:
    sent = np.arange(100, dtype=np.float64)
    flat = np.full(100, 1.2)
    assert trend(sent, flat) == (1.2, 1.2)
    rising = 1.0 + sent / 10  # a pipeline falling behind by a second every 10 s
    # the medians of sent 0-19 and of sent 80-99 (a fifth of the 99 s span each end)
    assert trend(sent, rising) == (2.0, 10.0)
    assert all(math.isnan(x) for x in trend(np.zeros(0), np.zeros(0)))
