"""Status math of a GlassPipeline: pure functions from what the operator sees to what it reports.

The operator aggregates its SparkApplications into ``metav1.Condition``s (Ready / Progressing /
Degraded) because tools such as Argo CD judge a custom resource only by its own status. Nothing here
talks to Kubernetes, so the rules are unit-tested directly: a condition's ``lastTransitionTime``
changes only when its status flips, reasons are CamelCase, messages name the failing replica and
carry spark-operator's ``errorMessage``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from glasspipe.controller.spark_operator import (
    FAILED_STATES,
    RUNNING,
    app_error_message,
    app_state,
    driver_lost,
    execution_attempts,
)

READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"
CONDITION_TYPES = (READY, PROGRESSING, DEGRADED)

# Reasons (CamelCase, as metav1.Condition requires).
REASON_RECONCILING = "Reconciling"
REASON_INVALID_SPEC = "InvalidSpec"
REASON_RECONCILE_ERROR = "ReconcileError"
REASON_REPLICA_FAILED = "ReplicaFailed"
REASON_REPLICA_RESTARTING = "ReplicaRestarting"
REASON_ROLLING_OUT = "RollingOut"
REASON_STARTING = "ReplicasStarting"
REASON_ALL_RUNNING = "AllReplicasRunning"
REASON_SUSPENDED = "Suspended"
REASON_SCALED_TO_ZERO = "ScaledToZero"
REASON_STABLE = "Stable"
REASON_AS_EXPECTED = "AsExpected"

MAX_MESSAGE = 4096


def now_rfc3339() -> str:
    """metav1.Time: RFC 3339 in UTC with second precision."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ConditionState:
    """What a condition should say now (without its bookkeeping fields)."""

    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str = ""


def merge_conditions(
    existing: Sequence[dict[str, Any]] | None,
    wanted: Iterable[ConditionState],
    generation: int | None,
    now: str,
) -> list[dict[str, Any]]:
    """The new ``status.conditions`` list: ours in a fixed order, then any others untouched.

    ``lastTransitionTime`` is carried over unless the status flips (or the condition is new);
    reason, message and observedGeneration are always the current ones.
    """
    old = {c.get("type"): c for c in existing or []}
    out: list[dict[str, Any]] = []
    ours = set()
    for w in wanted:
        ours.add(w.type)
        prev = old.get(w.type)
        flipped = prev is None or prev.get("status") != w.status or not prev.get("lastTransitionTime")
        cond: dict[str, Any] = {
            "type": w.type,
            "status": w.status,
            "reason": w.reason,
            "message": w.message[:MAX_MESSAGE],
            "lastTransitionTime": now if flipped else prev["lastTransitionTime"],  # type: ignore[index]
        }
        if generation is not None:
            cond["observedGeneration"] = generation
        out.append(cond)
    out.extend(c for c in existing or [] if c.get("type") not in ours)
    return out


@dataclass(frozen=True)
class Transition:
    """A condition whose status changed: worth a Kubernetes Event."""

    type: str
    old_status: str | None
    new_status: str
    reason: str
    message: str

    @property
    def warning(self) -> bool:
        """Bad news: Degraded turned True, or Ready turned False."""
        return (self.type == DEGRADED and self.new_status == "True") or (
            self.type == READY and self.new_status == "False" and self.old_status == "True"
        )


def transitions(old: Sequence[dict[str, Any]] | None, new: Sequence[dict[str, Any]]) -> list[Transition]:
    before = {c.get("type"): c.get("status") for c in old or []}
    return [
        Transition(c["type"], before.get(c["type"]), c["status"], c["reason"], c.get("message", ""))
        for c in new
        if c["type"] in CONDITION_TYPES and before.get(c["type"]) != c["status"]
    ]


def unknown_conditions() -> list[ConditionState]:
    """What a pipeline says before the operator's first full look (its first visit)."""
    msg = "glasspipe-operator has not finished its first reconciliation of this pipeline"
    return [ConditionState(t, "Unknown", REASON_RECONCILING, msg) for t in CONDITION_TYPES]


# ------------------------------------------------------------------------------ aggregation


@dataclass(frozen=True)
class ObservedApp:
    """One SparkApplication of the pipeline as the operator sees it."""

    name: str
    index: int
    state: str  # status.applicationState.state ("" before spark-operator's first look)
    error_message: str = ""
    current: bool = True  # its spec-hash matches the render of the current spec
    deleting: bool = False
    driver_message: str = ""  # what the failed driver left as its termination message
    attempts: int = 0  # status.executionAttempts

    @property
    def restarting(self) -> bool:
        """Its driver was lost and spark-operator is resubmitting it (spark_operator.driver_lost)."""
        return driver_lost(self.state, self.attempts)


def observe_app(obj: dict[str, Any], index: int, current: bool,
                driver_messages: dict[str, str] | None = None) -> ObservedApp:
    """Read the parts of a SparkApplication's status that matter to us (``driver_messages``: by the
    application's uid, see ``termination_messages``)."""
    return ObservedApp(
        name=obj["metadata"]["name"],
        index=index,
        state=app_state(obj),
        error_message=app_error_message(obj),
        current=current,
        deleting=bool(obj["metadata"].get("deletionTimestamp")),
        driver_message=(driver_messages or {}).get(str(obj["metadata"].get("uid")), ""),
        attempts=execution_attempts(obj),
    )


def termination_messages(pods: Iterable[dict[str, Any]]) -> dict[str, str]:
    """SparkApplication uid -> the termination message of its terminated driver container.

    spark-operator's ``errorMessage`` only says "driver container failed with ExitCode: 1, Reason: Error";
    the glasspipe job writes why it stopped (one line, no secrets) to /dev/termination-log, which the
    kubelet keeps in the container status."""
    out: dict[str, str] = {}
    for pod in pods:
        owners = [r.get("uid") for r in (pod.get("metadata") or {}).get("ownerReferences") or []
                  if r.get("kind") == "SparkApplication"]
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            for state in (cs.get("state"), cs.get("lastState")):
                message = ((state or {}).get("terminated") or {}).get("message")
                if message and owners:
                    out.setdefault(str(owners[0]), str(message).strip()[:MAX_MESSAGE])
    return out


@dataclass
class Assessment:
    """Everything the operator writes into ``status`` besides bookkeeping."""

    conditions: list[ConditionState]
    replicas: int
    ready_replicas: int
    replica_statuses: list[dict[str, Any]] = field(default_factory=list)


def replica_statuses(apps: Sequence[ObservedApp]) -> list[dict[str, Any]]:
    out = []
    for a in sorted(apps, key=lambda a: (a.index, a.name)):
        entry: dict[str, Any] = {"index": a.index, "application": a.name, "state": a.state}
        message = "; ".join(m for m in (a.driver_message, a.error_message) if m)
        if message:
            entry["message"] = message[:MAX_MESSAGE]
        out.append(entry)
    return out


def _failure_message(apps: Sequence[ObservedApp]) -> str:
    parts = []
    for a in apps:
        text = f"replica {a.name} is {a.state}"
        if a.driver_message:  # the job's own words first: spark-operator's only say how the driver exited
            text += f": {a.driver_message}"
            if a.error_message:
                text += f" ({a.error_message})"
        elif a.error_message:
            text += f": {a.error_message}"
        elif a.state == "COMPLETED":
            text += ": its driver exited with code 0 and spark-operator will not rerun it (a stream never ends)"
        parts.append(text)
    return "; ".join(parts)


def _restart_message(apps: Sequence[ObservedApp]) -> str:
    parts = []
    for a in apps:
        if a.state == "UNKNOWN":
            parts.append(f"replica {a.name} is UNKNOWN: spark-operator cannot tell whether its driver pod runs "
                         "(its node stopped reporting)")
        elif a.state == "SUBMITTED":
            parts.append(f"replica {a.name} lost its driver and was resubmitted (execution attempt {a.attempts}): "
                         "waiting for the new driver pod to run")
        else:
            parts.append(f"replica {a.name} lost its driver (execution attempt {a.attempts} ended) and spark-operator "
                         f"is resubmitting it ({a.state})")
    return "; ".join(parts)


def assess(
    desired: int,
    apps: Sequence[ObservedApp],
    *,
    suspended: bool = False,
    invalid: str | None = None,
    error: str | None = None,
    stopping_pods: Sequence[str] = (),
) -> Assessment:
    """Conditions and counters from the desired replica count and the observed applications.

    ``desired`` is the number of applications the current spec wants (0 when suspended);
    ``invalid`` is the deep validator's message when the spec cannot run (nothing was changed);
    ``error`` is an API failure of this reconciliation; ``stopping_pods`` are old driver pods still
    running, which hold back the creation of new applications.
    """
    existing = [a for a in apps if not a.deleting]
    ready = [a for a in apps if a.current and not a.deleting and a.state == RUNNING]
    failed = [a for a in apps if a.current and not a.deleting and a.state in FAILED_STATES]
    restarting = [a for a in apps if a.current and not a.deleting and a.restarting]
    statuses = replica_statuses(apps)

    def result(ready_c: ConditionState, prog: ConditionState, deg: ConditionState) -> Assessment:
        return Assessment([ready_c, prog, deg], len(existing), len(ready), statuses)

    if invalid is not None:
        msg = f"the spec cannot run, so no Spark application was created or changed: {invalid}"
        return result(
            ConditionState(READY, "False", REASON_INVALID_SPEC, msg),
            ConditionState(PROGRESSING, "False", REASON_INVALID_SPEC, "waiting for a valid spec"),
            ConditionState(DEGRADED, "True", REASON_INVALID_SPEC, invalid),
        )

    stale = [a for a in apps if not a.current or a.deleting]
    current = {a.index for a in apps if a.current and not a.deleting}
    missing = desired - len(current)
    rolling = bool(stale) or missing != 0 or bool(stopping_pods)

    # Degraded: a failing replica, one whose driver was lost and is being resubmitted, or the operator could
    # not do its job.
    if failed:
        degraded = ConditionState(DEGRADED, "True", REASON_REPLICA_FAILED,
                                  "; ".join(m for m in (_failure_message(failed), _restart_message(restarting)) if m))
    elif restarting:
        degraded = ConditionState(DEGRADED, "True", REASON_REPLICA_RESTARTING, _restart_message(restarting))
    elif error is not None:
        degraded = ConditionState(DEGRADED, "True", REASON_RECONCILE_ERROR, error)
    else:
        degraded = ConditionState(DEGRADED, "False", REASON_AS_EXPECTED, "no replica is failing")

    # Progressing: applications being stopped/created, or starting up.
    starting = [a for a in apps if a.current and not a.deleting and a.state != RUNNING and a.state not in FAILED_STATES]
    if rolling:
        what = []
        if stale:
            what.append(f"stopping {len(stale)} old application(s) first")
        if stopping_pods:
            what.append(f"waiting for old driver pod(s) {', '.join(stopping_pods)} to stop")
        if missing > 0:
            what.append(f"{missing} to create")
        target = "suspending" if suspended else f"rolling out {desired} replica(s)"
        progressing = ConditionState(PROGRESSING, "True", REASON_ROLLING_OUT, f"{target}: " + ", ".join(what))
    elif starting:
        names = ", ".join(f"{a.name} ({a.state or 'NEW'})" for a in starting)
        progressing = ConditionState(PROGRESSING, "True", REASON_STARTING, f"waiting for RUNNING: {names}")
    else:
        progressing = ConditionState(PROGRESSING, "False", REASON_STABLE, f"{len(ready)} of {desired} replicas running")

    # Ready: every wanted replica RUNNING the current spec, nothing else around.
    if not rolling and not failed and not restarting and len(ready) == desired:
        if desired == 0:
            reason = REASON_SUSPENDED if suspended else REASON_SCALED_TO_ZERO
            msg = ("suspended: no Spark application runs; checkpoints and offsets are kept" if suspended
                   else "scaled to 0 replicas: no Spark application runs")
            ready_c = ConditionState(READY, "True", reason, msg)
        else:
            ready_c = ConditionState(READY, "True", REASON_ALL_RUNNING, f"{desired} of {desired} replicas running")
    elif failed or restarting:
        ready_c = ConditionState(READY, "False", degraded.reason, degraded.message)
    else:
        reason = REASON_ROLLING_OUT if rolling else REASON_STARTING
        ready_c = ConditionState(READY, "False", reason, f"{len(ready)} of {desired} replicas running; "
                                 + progressing.message)
    return result(ready_c, progressing, degraded)
