"""kopf wiring: explicit settings, and thin handlers that all call the one reconcile.

Handlers are synchronous (kopf runs them in worker threads; the Kubernetes client is synchronous) and
return None, so kopf writes nothing into ``status``. Progress and diff-base bookkeeping live in
``glasspipe.io/*`` annotations; status belongs to the operator's own conditions.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import kopf
from kubernetes import client, config

from glasspipe.api import models
from glasspipe.contract import DEFAULT_SPARK_IMAGE
from glasspipe.controller import spark_operator
from glasspipe.controller.reconcile import Reconciler
from glasspipe.freshness import DEFAULT_INTERVAL as DEFAULT_FRESHNESS_INTERVAL
from glasspipe.render import PIPELINE_LABEL

FINALIZER = "glasspipe.io/finalizer"
ANNOTATION_PREFIX = "glasspipe.io"
# How often every pipeline is reconciled even when nothing was observed to change (level-triggered).
RECONCILE_INTERVAL = float(os.environ.get("GLASSPIPE_RECONCILE_INTERVAL", "10"))
# How often the drivers' metrics are read into status.replicaStatuses[].freshness (0: never); see
# glasspipe.freshness: in between, reconciliations carry the last entries over and write nothing new.
FRESHNESS_INTERVAL = float(os.environ.get("GLASSPIPE_FRESHNESS_INTERVAL", str(DEFAULT_FRESHNESS_INTERVAL)))
# The Spark image of pipelines whose spec.spark.image is not set.
SPARK_IMAGE = os.environ.get("GLASSPIPE_SPARK_IMAGE") or DEFAULT_SPARK_IMAGE

log = logging.getLogger("glasspipe.controller")
_reconciler: Reconciler | None = None


def reconciler() -> Reconciler:
    if _reconciler is None:
        raise kopf.TemporaryError("the operator is still starting", delay=1)
    return _reconciler


def _post_event(body: dict[str, Any], type: str, reason: str, message: str) -> None:
    kopf.event(body, type=type, reason=reason, message=message)  # type: ignore[arg-type]


def _api_client() -> client.ApiClient:
    """In-cluster credentials in a pod, else the kubeconfig ($KUBECONFIG) for local runs and tests."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Everything kopf would otherwise default, spelled out."""
    global _reconciler
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration")
    # Our Events are explicit (condition transitions); kopf's own log lines are not posted.
    settings.posting.enabled = True
    settings.posting.loggers = False
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "glasspipe-operator"
    settings.posting.reporting_instance = os.environ.get("POD_NAME", socket.gethostname())
    # Watches: the server ends each watch after ~5 min; the client gives it a margin; a silent
    # connection is re-established after 70 s without any event or bookmark.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.watching.inactivity_timeout = 70
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    settings.execution.max_workers = int(os.environ.get("GLASSPIPE_WORKERS", "8"))
    # Peering (standalone unless --peering) is set by main via kopf.run(standalone=..., peering_name=...).
    _reconciler = Reconciler(_api_client(), post_event=_post_event, freshness_interval=FRESHNESS_INTERVAL,
                             spark_image=SPARK_IMAGE)


@kopf.on.create(models.GROUP, models.VERSION, models.PLURAL)
def on_create(*, namespace: str | None, name: str, **_: Any) -> None:
    reconciler().trigger(namespace or "", name)


@kopf.on.update(models.GROUP, models.VERSION, models.PLURAL)
def on_update(*, namespace: str | None, name: str, **_: Any) -> None:
    reconciler().trigger(namespace or "", name)


@kopf.on.resume(models.GROUP, models.VERSION, models.PLURAL)
def on_resume(*, namespace: str | None, name: str, **_: Any) -> None:
    reconciler().trigger(namespace or "", name)


@kopf.timer(models.GROUP, models.VERSION, models.PLURAL, interval=RECONCILE_INTERVAL, initial_delay=RECONCILE_INTERVAL)
def periodic(*, namespace: str | None, name: str, **_: Any) -> None:
    reconciler().trigger(namespace or "", name)


@kopf.on.event(spark_operator.GROUP, spark_operator.VERSION, spark_operator.PLURAL,
               labels={PIPELINE_LABEL: kopf.PRESENT})
def on_application_event(*, body: kopf.Body, namespace: str | None, **_: Any) -> None:
    """A SparkApplication changed (spark-operator wrote its state, or it went away): re-check its owner."""
    for ref in body.metadata.get("ownerReferences") or []:
        if ref.get("kind") == models.KIND and ref.get("apiVersion", "").startswith(models.GROUP + "/"):
            reconciler().trigger(namespace or "", ref["name"])


@kopf.on.delete(models.GROUP, models.VERSION, models.PLURAL)
def on_delete(*, namespace: str | None, name: str, uid: str, **_: Any) -> None:
    """Remove the SparkApplications, then let the finalizer go. Checkpoints and offsets are kept."""
    remaining = reconciler().finalize(namespace or "", name, uid)
    if remaining:
        raise kopf.TemporaryError(
            f"waiting for {remaining} SparkApplication(s) and driver pod(s) to stop", delay=3)
