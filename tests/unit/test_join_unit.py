"""Which joins the job refuses to run, and the order it hands consumer groups to the batch writer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from glasspipe_job.config import JobConfig, UnsupportedPipeline, config_from_resource, load_job_config
from glasspipe_job.join import check_runnable, join_sides

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.unit


def config(replicas: int = 1, **join: Any) -> JobConfig:
    doc = yaml.safe_load((ROOT / "examples" / "orders-users-join.yaml").read_text())
    doc["spec"]["join"].update(join)
    return load_job_config(config_from_resource(doc, 0, replicas))


def test_sides_are_left_then_right_whatever_the_order_of_sources() -> None:
    c = config(left={"source": "users", "keys": ["user_id"]}, right={"source": "orders", "keys": ["user_id"]})
    assert [s.name for s in join_sides(c)] == ["users", "orders"]


def test_one_replica_joins_topics_with_any_partition_counts() -> None:
    check_runnable(config(), {"orders": 3, "users": 8})


def test_several_replicas_need_copartitioned_topics() -> None:
    check_runnable(config(replicas=2), {"orders": 4, "users": 4})
    with pytest.raises(UnsupportedPipeline, match="same partition count"):
        check_runnable(config(replicas=2), {"orders": 4, "users": 6})


def test_a_topic_cannot_be_joined_with_itself() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "orders-users-join.yaml").read_text())
    doc["spec"]["sources"][1]["kafka"]["topic"] = doc["spec"]["sources"][0]["kafka"]["topic"]
    c = load_job_config(config_from_resource(doc))
    with pytest.raises(UnsupportedPipeline, match="two topics"):
        check_runnable(c, {"orders": 1, "users": 1})
