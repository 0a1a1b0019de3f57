"""io.glasspipe.spark.TaskConf on real local Spark: a task pins one SQL conf for all its rows (Spark 4.2
would build one per call), the task's own, and the next task on the same thread starts without it."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ZONE_CONF = "spark.sql.session.timeZone"


def _probes(spark: Any) -> dict[int, list[str]]:
    """Each partition's probes in row order: 12 tasks of 40 rows on local[2]'s two task threads."""
    rows = spark.range(0, 480, 1, 12).selectExpr(
        "spark_partition_id() AS p", "id", "reflect('io.glasspipe.spark.TaskConf', 'probe', id) AS probe"
    ).collect()
    by_task: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for r in rows:
        by_task[r["p"]].append((r["id"], r["probe"]))
    return {p: [probe for _, probe in sorted(got)] for p, got in by_task.items()}


def test_a_task_pins_its_own_conf_once_and_the_next_task_starts_clean(spark: Any) -> None:
    before = spark.conf.get(ZONE_CONF)
    try:
        for zone in ("UTC", "America/Los_Angeles", "Asia/Kolkata"):
            spark.conf.set(ZONE_CONF, zone)
            probes = _probes(spark)
            assert len(probes) == 12
            for p, seen in probes.items():
                # the first row finds the thread's slot empty (the task before cleared its pin), pins
                assert seen[0] == f"clean|pinned|{zone}", (p, seen[:2])
                # every later row of the task finds the pin and reads the job's own settings through it
                assert set(seen[1:]) == {f"pinned|pinned|{zone}"}, (p, sorted(set(seen[1:])))
    finally:
        spark.conf.set(ZONE_CONF, before)


def test_outside_a_task_nothing_is_pinned(spark: Any) -> None:
    task_conf = spark.sparkContext._jvm.io.glasspipe.spark.TaskConf
    assert task_conf.available(), "this Spark's SQLConf has no thread slot by that name: the pin is a no-op"
    task_conf.pin()  # on the driver: no task, no pin
    assert task_conf.probe(0).startswith("clean|not|")
