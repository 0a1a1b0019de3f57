"""bench/soak_recovery.py: per fault, the peak lag until the next one and when the group caught up for good."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from soak_recovery import Recovery, recoveries, recovery_table


def test_back_after_is_the_first_sample_under_the_threshold_after_the_last_above() -> None:
    lags = [(10, 100), (12, 5000), (14, 900), (16, 4000), (18, 800), (20, 700)]
    found = recoveries([(11.0, "SIGKILL replica 0 of 2")], lags, threshold=1000, end=30)
    # 900 at 14 s is under, but the lag rose again at 16 s: back for good at 18 s, 7 s after the fault
    assert found == [Recovery(11.0, "SIGKILL replica 0 of 2", 5000, 7.0)]


def test_each_fault_sees_only_its_samples_until_the_next_fault() -> None:
    lags = [(1, 50), (3, 9000), (5, 8000), (7, 20), (9, 30)]
    found = recoveries([(0.0, "a"), (4.0, "b"), (8.0, "c")], lags, threshold=100, end=10)
    assert [(r.peak, r.back_after) for r in found] == [(9000, None), (8000, 3.0), (30, 0.0)]


def test_a_fault_with_no_samples_and_the_table() -> None:
    found = recoveries([(0.0, "Kafka stopping")], [], threshold=100, end=40)
    assert found == [Recovery(0.0, "Kafka stopping", 0, 0.0)]
    rows = recovery_table([Recovery(3.4, "x", 7, None), Recovery(9.6, "y", 0, 2.0)], 3.0)
    assert rows[0] == "| fault | at s | peak lag, records | back within 3 s of input after s |"
    assert rows[2:] == ["| x | 3 | 7 | not before the next fault |", "| y | 10 | 0 | 2 |"]
