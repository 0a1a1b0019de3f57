"""Child diffing: create missing, leave matching apps alone, replace stale ones stop-first."""

from __future__ import annotations

from typing import Any

import pytest

from glasspipe.controller.plan import plan_children, replica_index
from glasspipe.render import SPEC_HASH_ANNOTATION

pytestmark = pytest.mark.unit


def app(name: str, h: str, state: str = "", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "annotations": {SPEC_HASH_ANNOTATION: h}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"applicationState": {"state": state}}}


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
