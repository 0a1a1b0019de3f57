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


def test_closed_windows_reach_the_join_operator_as_text_by_partition() -> None:
    """io.glasspipe.spark.ClosedWindows parses ``p:end@w,end@w;p:...``; a partition without steps is left out."""
    from glasspipe_job.jvm import closed_windows_text

    text = closed_windows_text({1: [(8, 5000), (25, 8000)], 0: [(30, -1)], 2: []})
    assert text == "0:30@-1;1:8@5000,25@8000"
    assert closed_windows_text({}) == ""


def test_a_left_join_records_the_event_time_up_to_which_its_windows_are_closed() -> None:
    """The ledger's left_closed_ms: the batch's watermark less the join window (1 h in the example); nothing for an
    inner join, or before the first watermark."""
    from glasspipe_job.handover import left_closed_through_ms

    assert left_closed_through_ms(config(type="left").spec.join, 7_200_000) == 3_600_000
    assert left_closed_through_ms(config(type="left").spec.join, 0) == 0
    assert left_closed_through_ms(config(type="inner").spec.join, 7_200_000) == 0
    assert left_closed_through_ms(None, 7_200_000) == 0
