"""What glasspipe knows of Kubeflow spark-operator, in one place (as spark-operator keeps it in
``pkg/util/sparkapplication.go``): the SparkApplication API coordinates, the application states and
what they mean for a stream, where the status keeps them, and how driver pods are labelled."""

from __future__ import annotations

from typing import Any

GROUP = "sparkoperator.k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "SparkApplication"
PLURAL = "sparkapplications"

# spark-operator labels the pods it submits spark-role=driver (and copies the application's labels).
DRIVER_POD_LABEL = "spark-role=driver"

# status.applicationState.state values, grouped by what they mean for a stream.
RUNNING = "RUNNING"
SUBMITTED, PENDING_RERUN, SUCCEEDING, UNKNOWN = "SUBMITTED", "PENDING_RERUN", "SUCCEEDING", "UNKNOWN"
# A stream never ends on its own, so COMPLETED (the driver exited 0 and will not be rerun) is a failure too.
FAILED_STATES = frozenset({"FAILED", "SUBMISSION_FAILED", "FAILING", "COMPLETED"})
# A stopped driver: a stale application in one of these states no longer processes records.
TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "SUBMISSION_FAILED"})


def app_state(obj: dict[str, Any]) -> str:
    """``status.applicationState.state`` ("" before spark-operator's first look)."""
    return str(((obj.get("status") or {}).get("applicationState") or {}).get("state") or "")


def app_error_message(obj: dict[str, Any]) -> str:
    """``status.applicationState.errorMessage`` (why a submission or driver failed)."""
    return str(((obj.get("status") or {}).get("applicationState") or {}).get("errorMessage") or "")


def execution_attempts(obj: dict[str, Any]) -> int:
    """``status.executionAttempts``: spark-operator adds one per submission that started a driver (a failed
    submission counts in ``submissionAttempts`` only) and keeps the count across reruns (it resets it only
    when a spec change invalidates the application)."""
    return int((obj.get("status") or {}).get("executionAttempts") or 0)


def driver_lost(state: str, attempts: int) -> bool:
    """A driver that ran has stopped and spark-operator is bringing the application back (restartPolicy
    Always), as v2.5.2's controller does it (internal/controller/sparkapplication/controller.go):
    a deleted or exited driver pod makes RUNNING go to FAILING ("driver pod not found", or the exit code)
    or, on exit code 0, to SUCCEEDING; both go to PENDING_RERUN at once when the retry is due (the
    interval counts from the last submission, so a driver that ran long is resubmitted immediately);
    PENDING_RERUN waits for the old pod to be gone and lasts through spark-submit; then SUBMITTED with
    one more execution attempt until the new driver pod runs. The short states are easily missed by a
    watcher, the attempt count is not: SUBMITTED with more than one attempt is a rerun, and so is
    PENDING_RERUN after a run (after a spec change it has 0 attempts). UNKNOWN: the driver pod's
    phase is Unknown (its node stopped reporting)."""
    return (state in (SUCCEEDING, PENDING_RERUN) and attempts >= 1) or (state == SUBMITTED and attempts >= 2) \
        or state == UNKNOWN
