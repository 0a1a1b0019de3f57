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
FAILED_STATES = frozenset({"FAILED", "SUBMISSION_FAILED", "FAILING"})
# A stopped driver: a stale application in one of these states no longer processes records.
TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "SUBMISSION_FAILED"})


def app_state(obj: dict[str, Any]) -> str:
    """``status.applicationState.state`` ("" before spark-operator's first look)."""
    return str(((obj.get("status") or {}).get("applicationState") or {}).get("state") or "")


def app_error_message(obj: dict[str, Any]) -> str:
    """``status.applicationState.errorMessage`` (why a submission or driver failed)."""
    return str(((obj.get("status") or {}).get("applicationState") or {}).get("errorMessage") or "")
