"""Condition math: lastTransitionTime moves only on a flip; Ready/Progressing/Degraded follow the apps."""

from __future__ import annotations

import pytest

from glasspipe import conditions as c
from glasspipe.conditions import ConditionState, ObservedApp, assess, merge_conditions, transitions

pytestmark = pytest.mark.unit

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def by_type(conds: list[ConditionState]) -> dict[str, ConditionState]:
    return {x.type: x for x in conds}


def app(i: int, state: str, msg: str = "", current: bool = True, deleting: bool = False,
        attempts: int = 1) -> ObservedApp:
    return ObservedApp(f"p-{i}", i, state, msg, current, deleting, attempts=attempts)


def test_transition_time_kept_unless_status_flips() -> None:
    first = merge_conditions([], [ConditionState("Ready", "False", "ReplicasStarting", "0 of 2")], 1, T0)
    assert first == [{"type": "Ready", "status": "False", "reason": "ReplicasStarting", "message": "0 of 2",
                      "lastTransitionTime": T0, "observedGeneration": 1}]
    same = merge_conditions(first, [ConditionState("Ready", "False", "RollingOut", "1 of 2")], 2, T1)
    assert same[0]["lastTransitionTime"] == T0
    assert (same[0]["reason"], same[0]["message"], same[0]["observedGeneration"]) == ("RollingOut", "1 of 2", 2)
    flipped = merge_conditions(same, [ConditionState("Ready", "True", "AllReplicasRunning")], 2, T1)
    assert flipped[0]["lastTransitionTime"] == T1


def test_foreign_conditions_are_kept_and_ours_come_first_in_order() -> None:
    other = {"type": "Argo", "status": "True", "reason": "X", "message": "", "lastTransitionTime": T0}
    out = merge_conditions([other], c.unknown_conditions(), None, T1)
    assert [x["type"] for x in out] == ["Ready", "Progressing", "Degraded", "Argo"]
    assert all(x["status"] == "Unknown" and "observedGeneration" not in x for x in out[:3])


def test_transitions_mark_bad_news_as_warnings() -> None:
    old = merge_conditions([], [ConditionState("Ready", "True", "AllReplicasRunning"),
                                ConditionState("Degraded", "False", "AsExpected")], 1, T0)
    new = merge_conditions(old, [ConditionState("Ready", "False", "ReplicaFailed", "boom"),
                                 ConditionState("Degraded", "True", "ReplicaFailed", "boom")], 1, T1)
    ts = transitions(old, new)
    assert [(t.type, t.old_status, t.new_status, t.warning) for t in ts] == [
        ("Ready", "True", "False", True), ("Degraded", "False", "True", True)]
    assert transitions(new, new) == []


def test_all_running_is_ready() -> None:
    a = assess(2, [app(0, "RUNNING"), app(1, "RUNNING")])
    cs = by_type(a.conditions)
    assert (cs["Ready"].status, cs["Ready"].reason) == ("True", "AllReplicasRunning")
    assert (cs["Progressing"].status, cs["Degraded"].status) == ("False", "False")
    assert (a.replicas, a.ready_replicas) == (2, 2)
    assert a.replica_statuses == [{"index": 0, "application": "p-0", "state": "RUNNING"},
                                  {"index": 1, "application": "p-1", "state": "RUNNING"}]


@pytest.mark.parametrize(("state", "attempts"), [("", 0), ("SUBMITTED", 1), ("PENDING_RERUN", 0),
                                                 ("INVALIDATING", 1)])
def test_starting_states_are_progressing(state: str, attempts: int) -> None:
    """A first submission, and a rerun after a spec change (spark-operator resets the attempts to 0)."""
    cs = by_type(assess(2, [app(0, "RUNNING"), app(1, state, attempts=attempts)]).conditions)
    assert (cs["Progressing"].status, cs["Progressing"].reason) == ("True", "ReplicasStarting")
    assert (cs["Ready"].status, cs["Degraded"].status) == ("False", "False")
    assert "p-1" in cs["Progressing"].message


@pytest.mark.parametrize("state", ["FAILED", "SUBMISSION_FAILED", "FAILING", "COMPLETED"])
def test_failed_states_are_degraded_with_replica_and_error(state: str) -> None:
    a = assess(2, [app(0, "RUNNING"), app(1, state, "driver OOMKilled")])
    cs = by_type(a.conditions)
    assert (cs["Degraded"].status, cs["Degraded"].reason) == ("True", "ReplicaFailed")
    assert cs["Degraded"].message == f"replica p-1 is {state}: driver OOMKilled"
    assert (cs["Ready"].status, cs["Ready"].reason) == ("False", "ReplicaFailed")
    assert a.ready_replicas == 1
    assert a.replica_statuses[1]["message"] == "driver OOMKilled"


@pytest.mark.parametrize(("state", "attempts", "says"), [
    ("SUCCEEDING", 1, "lost its driver (execution attempt 1 ended) and spark-operator is resubmitting it (SUCCEEDING)"),
    ("PENDING_RERUN", 1, "lost its driver (execution attempt 1 ended) and spark-operator is resubmitting it"),
    ("SUBMITTED", 2, "lost its driver and was resubmitted (execution attempt 2): waiting for the new driver pod"),
    ("UNKNOWN", 1, "spark-operator cannot tell whether its driver pod runs"),
])
def test_a_lost_driver_being_resubmitted_is_degraded(state: str, attempts: int, says: str) -> None:
    """spark-operator v2.5.2 after `kubectl delete pod` of a driver: RUNNING -> FAILING or SUCCEEDING ->
    PENDING_RERUN (through spark-submit) -> SUBMITTED (attempt 2) -> RUNNING; the first two last
    milliseconds, so the attempt count tells a rerun from a first start."""
    a = assess(2, [app(0, "RUNNING"), app(1, state, attempts=attempts)])
    cs = by_type(a.conditions)
    assert (cs["Degraded"].status, cs["Degraded"].reason) == ("True", "ReplicaRestarting")
    assert cs["Degraded"].message.startswith("replica p-1 ") and says in cs["Degraded"].message
    assert (cs["Ready"].status, cs["Ready"].reason) == ("False", "ReplicaRestarting")
    assert (cs["Progressing"].status, cs["Progressing"].reason) == ("True", "ReplicasStarting")
    assert a.ready_replicas == 1
    # Running again: Ready, not Degraded, whatever the attempt count.
    cs = by_type(assess(2, [app(0, "RUNNING"), app(1, "RUNNING", attempts=attempts + 1)]).conditions)
    assert (cs["Ready"].status, cs["Degraded"].status) == ("True", "False")


def test_a_failed_and_a_restarting_replica_are_both_named() -> None:
    cs = by_type(assess(2, [app(0, "FAILING", "exit 1"), app(1, "PENDING_RERUN", attempts=3)]).conditions)
    assert (cs["Degraded"].reason, cs["Ready"].reason) == ("ReplicaFailed", "ReplicaFailed")
    assert "replica p-0 is FAILING: exit 1" in cs["Degraded"].message and "replica p-1 lost its driver" in \
        cs["Degraded"].message


def test_missing_or_stale_apps_are_rolling_out() -> None:
    cs = by_type(assess(3, [app(0, "RUNNING", current=False), app(1, "RUNNING", current=False)]).conditions)
    assert (cs["Progressing"].status, cs["Progressing"].reason) == ("True", "RollingOut")
    assert "stopping 2 old" in cs["Progressing"].message and "3 to create" in cs["Progressing"].message
    assert (cs["Ready"].status, cs["Ready"].reason) == ("False", "RollingOut")
    # A stale application's failure is not the new spec's failure.
    cs = by_type(assess(1, [app(0, "FAILED", "old", current=False)]).conditions)
    assert cs["Degraded"].status == "False"


def test_suspended_and_scaled_to_zero() -> None:
    cs = by_type(assess(0, [], suspended=True).conditions)
    assert (cs["Ready"].status, cs["Ready"].reason) == ("True", "Suspended")
    cs = by_type(assess(0, []).conditions)
    assert (cs["Ready"].status, cs["Ready"].reason) == ("True", "ScaledToZero")
    cs = by_type(assess(0, [app(0, "RUNNING", current=False)], suspended=True).conditions)
    assert (cs["Progressing"].status, cs["Ready"].status) == ("True", "False")
    assert cs["Progressing"].message.startswith("suspending")


def test_invalid_spec_is_degraded_and_counts_existing_apps() -> None:
    a = assess(2, [app(0, "RUNNING"), app(1, "RUNNING")], invalid="spec.sources[0].filter: bad")
    cs = by_type(a.conditions)
    assert (cs["Degraded"].status, cs["Degraded"].reason, cs["Degraded"].message) == (
        "True", "InvalidSpec", "spec.sources[0].filter: bad")
    assert (cs["Ready"].status, cs["Ready"].reason) == ("False", "InvalidSpec")
    assert cs["Progressing"].status == "False"
    assert (a.replicas, a.ready_replicas) == (2, 2)


def test_api_error_is_degraded() -> None:
    cs = by_type(assess(1, [], error="403 Forbidden").conditions)
    assert (cs["Degraded"].status, cs["Degraded"].reason) == ("True", "ReconcileError")


def test_observe_app_reads_spark_operator_status() -> None:
    obj = {"metadata": {"name": "p-0"},
           "status": {"applicationState": {"state": "FAILING", "errorMessage": "exit 1"}, "executionAttempts": 3}}
    assert c.observe_app(obj, 0, True) == ObservedApp("p-0", 0, "FAILING", "exit 1", True, False, attempts=3)
    assert c.observe_app({"metadata": {"name": "p-0"}}, 0, True).state == ""
