"""The shape of a query's state, recorded with each checkpoint: a checkpoint of another shape is set aside."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from glasspipe_job.config import config_from_resource, load_job_config
from glasspipe_job.join import JOIN_BUCKETS, JOIN_DEDUP_BUCKETS_PLAN, JOIN_STATE_PLAN
from glasspipe_job.runner import DEDUP_BUCKETS_PLAN, state_plan

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.unit


def plan_of(example: str, **dedup: Any) -> str:
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    if dedup:
        doc["spec"]["sources"][0]["deduplication"].update(dedup)
    return state_plan(load_job_config(config_from_resource(doc, 0, 1)))


def plan_of_join(example: str, join_type: str) -> str:
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    doc["spec"]["join"]["type"] = join_type
    return state_plan(load_job_config(config_from_resource(doc, 0, 1)))


def test_a_left_join_keeps_its_plan() -> None:
    """A left join still keeps a timer a key: its checkpoints resume."""
    assert plan_of_join("orders-users-join.yaml", "left") == JOIN_STATE_PLAN


def test_an_inner_join_records_its_bucketed_state() -> None:
    """An inner join was grouped by key under JOIN_STATE_PLAN; now by a bucket of keys: such a checkpoint is set
    aside, with or without deduplicating sides."""
    assert plan_of_join("orders-users-join.yaml", "inner") == JOIN_STATE_PLAN + JOIN_BUCKETS
    assert plan_of_join("dedup-then-join.yaml", "inner") == JOIN_DEDUP_BUCKETS_PLAN + JOIN_BUCKETS


def test_a_join_with_a_deduplicating_side_records_its_bucketed_state() -> None:
    """Its sides' dedup state was a value and a timer a key under JOIN_STATE_PLAN: such a checkpoint is set aside."""
    assert plan_of_join("dedup-then-join.yaml", "left") == JOIN_DEDUP_BUCKETS_PLAN != JOIN_STATE_PLAN


def test_the_default_engine_records_its_bucketed_state() -> None:
    """A checkpoint of the default engine's earlier layout (a timer a key) was recorded as plan "": it is set aside,
    not resumed with a processor whose state variables differ. The window is not in the plan: the buckets' timers
    follow whatever window their keys are read with."""
    assert plan_of("sms-dedup.yaml") == DEDUP_BUCKETS_PLAN != ""
    assert plan_of("sms-dedup.yaml", window="8h") == DEDUP_BUCKETS_PLAN


def test_deduplication_per_kafka_partition_records_its_engine_and_window() -> None:
    """Its keys are laid out by fractions of the window: another window is another state."""
    five = plan_of("sms-dedup.yaml", perKafkaPartition=True)
    assert five == "dedup-per-kafka-partition/2/window=300000ms"
    assert plan_of("sms-dedup.yaml", perKafkaPartition=True, window="8h") != five
