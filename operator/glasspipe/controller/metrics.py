"""Prometheus metrics of the operator itself (the pipelines' data metrics come from the Spark job)."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "glasspipe_operator_reconciles_total",
    "Reconciliations of a GlassPipeline, by outcome (ok, invalid_spec, error).",
    ["result"],
)
RECONCILE_ERRORS = Counter(
    "glasspipe_operator_reconcile_errors_total",
    "Reconciliations that failed on a Kubernetes API call or an unexpected exception.",
)
RECONCILE_SECONDS = Histogram(
    "glasspipe_operator_reconcile_duration_seconds",
    "Wall time of one reconciliation.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
CHILD_OPERATIONS = Counter(
    "glasspipe_operator_sparkapplication_operations_total",
    "SparkApplications created or deleted by the operator.",
    ["operation"],
)
READY_REPLICAS = Gauge(
    "glasspipe_pipeline_ready_replicas",
    "Replicas of a pipeline whose SparkApplication is RUNNING the current spec.",
    ["namespace", "pipeline"],
)
DESIRED_REPLICAS = Gauge(
    "glasspipe_pipeline_desired_replicas",
    "Replicas a pipeline's spec asks for (0 while suspended).",
    ["namespace", "pipeline"],
)


def forget_pipeline(namespace: str, pipeline: str) -> None:
    """Drop a deleted pipeline's series so that they do not linger at their last value."""
    for gauge in (READY_REPLICAS, DESIRED_REPLICAS):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, pipeline)
