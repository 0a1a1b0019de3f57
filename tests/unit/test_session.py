"""How many tasks the job's first stage runs (session.task_slots): pure, no Spark."""

from __future__ import annotations

import pytest

from glasspipe_job.session import task_slots

pytestmark = pytest.mark.unit


def test_local_session_uses_its_default_parallelism() -> None:
    assert task_slots(2, {"spark.master": "local[2]"}) == 2


def test_configured_executors_count_before_they_register() -> None:
    # the spark-operator passes spec.spark.executor as spark.executor.instances / .cores; at query start only
    # some executors may have registered (default parallelism then counts only theirs)
    assert task_slots(2, {"spark.executor.instances": "3", "spark.executor.cores": "2"}) == 6
    assert task_slots(8, {"spark.executor.instances": "3", "spark.executor.cores": "2"}) == 8


def test_executor_cores_default_to_one_and_zero_instances_count_nothing() -> None:
    assert task_slots(2, {"spark.executor.instances": "4"}) == 4
    assert task_slots(0, {"spark.executor.instances": "0"}) == 1
