"""bench/workload.py's plans on disk: a soak's stream written in chunks and read back is the stream one plan makes
in memory, so a run's figures do not depend on which one offered it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from join_stream import PairWorkload
from workload import Plan, SpilledPlan, Workload, spill_plan


def read_back(plan: Plan | SpilledPlan) -> tuple[list[bytes], list[bytes], list[str] | None]:
    keys: list[bytes] = []
    heads: list[bytes] = []
    topics: list[str] | None = None
    for part in plan.chunks():
        keys += part.keys
        heads += part.heads
        if part.topics is not None:
            topics = (topics or []) + part.topics
    return keys, heads, topics


@pytest.mark.parametrize("scattered", [False, True])
def test_a_spilled_plan_is_the_stream_one_plan_makes(tmp_path: Path, scattered: bool) -> None:
    # repeats due up to 3 s later cross the chunks' edges (rate 1 000/s, chunks of 701 events)
    shape: dict[str, Any] = {"seed": 5, "scattered_keys": scattered, "max_repeat_delay_s": 3.0}
    whole = Workload(**shape).plan(5_000, 1000)
    workload = Workload(**shape)
    spilled = spill_plan(lambda k: workload.plan(k, 1000), 5_000, tmp_path, chunk=701)
    assert (len(spilled), spilled.repeats) == (5_000, whole.repeats) and whole.repeats > 300
    assert read_back(spilled) == (whole.keys, whole.heads, None)
    assert [len(part) for part in spilled.chunks()] == [701] * 7 + [93]
    assert workload.firsts == 5_000 - whole.repeats


def test_a_spilled_plan_keeps_each_records_topic(tmp_path: Path) -> None:
    whole = PairWorkload("orders").plan(1_000, 1.0)
    pairs = PairWorkload("orders")
    spilled = spill_plan(lambda k: pairs.plan(k, 1.0), 1_000, tmp_path, chunk=300)
    assert read_back(spilled) == (whole.keys, whole.heads, whole.topics)
    assert spilled.repeats == whole.repeats == 500 and set(whole.topics or []) == {"orders", "orders-users"}
