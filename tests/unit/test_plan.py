"""Child diffing: create missing, leave matching apps alone, replace stale ones stop-first."""

from __future__ import annotations

from typing import Any

import pytest

from glasspipe.controller.plan import holds, lingering_drivers, metadata_patch, plan_children, replica_index
from glasspipe.render import SPEC_HASH_ANNOTATION

pytestmark = pytest.mark.unit


def app(name: str, h: str, state: str = "", deleting: bool = False, spec: Any = None) -> dict[str, Any]:
    """An application whose spec is ``{"config": h}`` (what the hash ``h`` stands for) unless given."""
    meta: dict[str, Any] = {"name": name, "annotations": {SPEC_HASH_ANNOTATION: h},
                            "labels": {"glasspipe.io/pipeline": "p"}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"config": h} if spec is None else spec,
            "status": {"applicationState": {"state": state}}}


def names(objs: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in objs]


def test_first_visit_creates_all() -> None:
    plan = plan_children([app("p-0", "a"), app("p-1", "a")], [])
    assert names(plan.create) == ["p-0", "p-1"] and not plan.delete and not plan.waiting


def test_matching_apps_untouched() -> None:
    plan = plan_children([app("p-0", "a"), app("p-1", "a")], [app("p-0", "a", "RUNNING"), app("p-1", "a")])
    assert plan.converged and plan.current == ["p-0", "p-1"]


def test_only_changed_hash_is_replaced_after_it_is_gone() -> None:
    desired = [app("p-0", "a"), app("p-1", "b")]
    plan = plan_children(desired, [app("p-0", "a", "RUNNING"), app("p-1", "old", "RUNNING")])
    assert plan.delete == ["p-1"] and plan.create == [] and plan.waiting == ["p-1"] and plan.current == ["p-0"]
    # Deleting, not yet gone: nothing new.
    plan = plan_children(desired, [app("p-0", "a", "RUNNING"), app("p-1", "old", "RUNNING", deleting=True)])
    assert plan.delete == [] and plan.create == [] and plan.waiting == ["p-1"]
    # Gone: recreate.
    plan = plan_children(desired, [app("p-0", "a", "RUNNING")])
    assert names(plan.create) == ["p-1"]


def test_rescale_is_stop_first() -> None:
    old = [app("p-0", "r2", "RUNNING"), app("p-1", "r2", "RUNNING")]
    up = [app("p-0", "r3"), app("p-1", "r3"), app("p-2", "r3")]
    plan = plan_children(up, old)
    assert plan.delete == ["p-0", "p-1"] and plan.create == [] and set(plan.waiting) == {"p-0", "p-1", "p-2"}
    # The old drivers are gone: all three start.
    assert names(plan_children(up, []).create) == ["p-0", "p-1", "p-2"]
    # Scale down: extras deleted, survivors replaced (their partition share changes).
    down = [app("p-0", "r1")]
    plan = plan_children(down, old)
    assert plan.delete == ["p-0", "p-1"] and plan.create == []


def test_terminal_stale_apps_do_not_block_new_names() -> None:
    desired = [app("p-0", "a"), app("p-1", "a")]
    plan = plan_children(desired, [app("p-0", "a", "RUNNING"), app("p-5", "x", "FAILED", deleting=True)])
    assert names(plan.create) == ["p-1"] and plan.stale == ["p-5"]


def test_suspend_deletes_everything() -> None:
    plan = plan_children([], [app("p-0", "a", "RUNNING"), app("p-1", "a")])
    assert plan.delete == ["p-0", "p-1"] and not plan.create


def test_replica_index() -> None:
    assert replica_index({"metadata": {"name": "x-3", "labels": {"glasspipe.io/replica": "7"}}}) == 7
    assert replica_index({"metadata": {"name": "x-3"}}) == 3
    assert replica_index({"metadata": {"name": "x"}}) == -1


def test_hand_edited_spec_is_drift_and_replaced_stop_first() -> None:
    desired = [app("p-0", "a")]
    edited = app("p-0", "a", "RUNNING", spec={"config": "a", "nested": 1})  # an added field is a default: fine
    assert plan_children(desired, [edited]).converged
    edited = app("p-0", "a", "RUNNING", spec={"config": "by hand"})
    plan = plan_children(desired, [edited])
    assert plan.drifted == ["p-0"] and plan.delete == ["p-0"] and plan.waiting == ["p-0"] and not plan.create


def test_lost_labels_and_annotations_are_patched_back_not_replaced() -> None:
    desired = [app("p-0", "a")]
    bare = app("p-0", "a", "RUNNING")
    bare["metadata"]["labels"] = {"other": "x"}
    del bare["metadata"]["annotations"]
    plan = plan_children(desired, [bare])
    assert plan.current == ["p-0"] and not plan.delete and not plan.drifted
    assert plan.relabel == {"p-0": {"metadata": {"labels": {"glasspipe.io/pipeline": "p"},
                                                 "annotations": {SPEC_HASH_ANNOTATION: "a"}}}}
    assert not plan.converged
    assert metadata_patch(desired[0], desired[0]) is None


def test_holds_is_a_subset_match() -> None:
    assert holds({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2, "c": 3}], "d": 4})
    assert not holds({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]})
    assert not holds({"a": [1, 2]}, {"a": [1, 2, 3]})
    assert not holds({"a": 1}, {})


def test_lingering_drivers_are_running_pods_of_gone_or_stale_apps() -> None:
    def pod(name: str, owner: str, phase: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "ownerReferences": [{"uid": owner}]}, "status": {"phase": phase}}

    pods = [pod("p-0-driver", "old-uid", "Running"), pod("p-1-driver", "new-uid", "Running"),
            pod("p-2-driver", "gone-uid", "Succeeded"), pod("p-3-driver", "gone-uid", "Failed")]
    assert lingering_drivers(pods, {"new-uid"}) == ["p-0-driver"]
    assert lingering_drivers(pods, {"new-uid", "old-uid"}) == []
