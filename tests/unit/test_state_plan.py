"""The shape of a query's state, recorded with each checkpoint: a checkpoint of another shape is set aside."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from glasspipe_job.config import config_from_resource, load_job_config
from glasspipe_job.join import (
    JOIN_BUCKETS,
    JOIN_DEDUP_BUCKETS_PLAN,
    JOIN_OWN_STATE_SIDES,
    JOIN_PACKED_ROWS,
    JOIN_STATE_PLAN,
    LEFT_JOIN_BUCKETS,
)
from glasspipe_job.runner import DEDUP_BUCKETS_PLAN, state_plan

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.unit


def plan_of(example: str, **dedup: Any) -> str:
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    if dedup:
        doc["spec"]["sources"][0]["deduplication"].update(dedup)
    return state_plan(load_job_config(config_from_resource(doc, 0, 1)))


def plan_of_join(example: str, join_type: str, *, users_fields: list[dict[str, Any]] | None = None) -> str:
    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    doc["spec"]["join"]["type"] = join_type
    if users_fields is not None:
        doc["spec"]["sources"][1]["schema"]["fields"] = users_fields
    return state_plan(load_job_config(config_from_resource(doc, 0, 1)))


def packed(plan: str) -> tuple[str, str]:
    """(the plan before JOIN_PACKED_ROWS, the fields' digest after it)."""
    before, _, digest = plan.partition(JOIN_PACKED_ROWS + ":")
    assert len(digest) == 12 and int(digest, 16) >= 0, plan
    return before, digest


def test_a_left_join_records_its_bucketed_state() -> None:
    """A left join kept a timer a key, under plain JOIN_STATE_PLAN (with JOIN_PACKED_ROWS, its sides' fields as
    bytes); now its keys are in buckets, with its own state variables: such a checkpoint is set aside, with or
    without deduplicating sides, and an inner join's bucketed state is not read as a left join's."""
    assert packed(plan_of_join("orders-users-join.yaml", "left"))[0] == JOIN_STATE_PLAN + LEFT_JOIN_BUCKETS
    assert packed(plan_of_join("dedup-then-join.yaml", "left"))[0] == JOIN_DEDUP_BUCKETS_PLAN + LEFT_JOIN_BUCKETS
    assert LEFT_JOIN_BUCKETS != JOIN_BUCKETS


def test_an_inner_join_records_its_bucketed_state() -> None:
    """An inner join was grouped by key under JOIN_STATE_PLAN; now by a bucket of keys: such a checkpoint is set
    aside, with or without deduplicating sides."""
    assert packed(plan_of_join("orders-users-join.yaml", "inner"))[0] == JOIN_STATE_PLAN + JOIN_BUCKETS
    assert packed(plan_of_join("dedup-then-join.yaml", "inner"))[0] == JOIN_DEDUP_BUCKETS_PLAN + JOIN_BUCKETS


def test_a_join_with_a_deduplicating_side_records_its_bucketed_state() -> None:
    """Its sides' dedup state was a value and a timer a key under JOIN_STATE_PLAN: such a checkpoint is set aside."""
    assert packed(plan_of_join("dedup-then-join.yaml", "left"))[0].startswith(JOIN_DEDUP_BUCKETS_PLAN)
    assert JOIN_DEDUP_BUCKETS_PLAN != JOIN_STATE_PLAN


def test_a_joins_plan_names_its_sides_fields() -> None:
    """The packed bytes are read by position and type: a field added, moved or retyped on either side is another
    state (set aside and rebuilt), while the same fields give the same plan and the join type does not move the
    digest."""
    doc = yaml.safe_load((ROOT / "examples" / "orders-users-join.yaml").read_text())
    fields: list[dict[str, Any]] = doc["spec"]["sources"][1]["schema"]["fields"]
    inner = plan_of_join("orders-users-join.yaml", "inner")
    assert plan_of_join("orders-users-join.yaml", "inner", users_fields=[dict(f) for f in fields]) == inner
    assert packed(plan_of_join("orders-users-join.yaml", "left"))[1] == packed(inner)[1]
    added = [*fields, {"name": "tier", "type": "string"}]
    reordered = [fields[0], fields[2], fields[1], fields[3]]  # plan before country
    retyped = [{**f, "type": "long"} if f["name"] == "plan" else f for f in fields]
    digests = {packed(plan_of_join("orders-users-join.yaml", "inner", users_fields=v))[1]
               for v in (fields, added, reordered, retyped)}
    assert len(digests) == 4, digests


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


def test_deduplication_in_own_state_records_its_engine_window_and_shuffle_partitions() -> None:
    """A store per shuffle partition, keys laid out by fractions of the window: another window or another number of
    shuffle partitions is another state, and so is either other engine's."""
    own = plan_of("sms-dedup.yaml", ownState=True)
    assert own == "dedup-own-state/1/window=300000ms/partitions=2"
    assert plan_of("sms-dedup.yaml", ownState=True, window="8h") != own
    assert own not in (DEDUP_BUCKETS_PLAN, plan_of("sms-dedup.yaml", perKafkaPartition=True))
    doc = yaml.safe_load((ROOT / "examples" / "sms-dedup.yaml").read_text())
    doc["spec"]["sources"][0]["deduplication"]["ownState"] = True
    doc["spec"].setdefault("spark", {})["shufflePartitions"] = 4
    four = state_plan(load_job_config(config_from_resource(doc, 0, 1)))
    assert four == "dedup-own-state/1/window=300000ms/partitions=4"


def test_a_joins_side_in_own_state_records_its_window_and_shuffle_partitions() -> None:
    """A side deduplicating in own state has no transformWithState of its own (Spark numbers the join's store
    differently) and keeps its keys by fractions of its window in a store per shuffle partition: each of those is
    another state. A join without it keeps the plan it had, so its checkpoints resume."""
    def plan(**own: Any) -> str:
        doc = yaml.safe_load((ROOT / "examples" / "dedup-then-join.yaml").read_text())
        for s in doc["spec"]["sources"]:
            s["deduplication"].update(own.get(s["name"], {}))
        return state_plan(load_job_config(config_from_resource(doc, 0, 1)))

    default = plan()
    assert JOIN_OWN_STATE_SIDES not in default and default.startswith(JOIN_DEDUP_BUCKETS_PLAN + LEFT_JOIN_BUCKETS)
    users = plan(users={"ownState": True})
    assert users == f"{default}{JOIN_OWN_STATE_SIDES}:users=window=3600000ms/partitions=2", users
    both = plan(orders={"ownState": True}, users={"ownState": True})
    assert both.endswith(":orders=window=3600000ms,users=window=3600000ms/partitions=2"), both
    assert len({default, users, both, plan(users={"ownState": True, "window": "8h"})}) == 4
