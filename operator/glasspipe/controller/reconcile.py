"""One level-triggered reconciliation of a GlassPipeline: observe -> validate -> converge -> report.

Every trigger (create, update, resume, the periodic timer, a SparkApplication event) ends here, and
each run starts from a fresh read of the pipeline and its applications, so a missed or repeated event
changes nothing. Triggers for one pipeline are coalesced: while a run is in progress, further triggers
only mark the pipeline dirty and the running thread goes around once more.

The operator never writes a GlassPipeline's spec; it writes its status through the status
subresource (a merge patch, only when something changed) and posts an Event when a condition flips.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from glasspipe import conditions as cond
from glasspipe.api import models
from glasspipe.api.validation import SpecInvalid, validate_spec
from glasspipe.controller import metrics
from glasspipe.controller.plan import plan_children, replica_index, spec_hash_of
from glasspipe.render import PIPELINE_LABEL, SPARK_API_VERSION, SPARK_PLURAL, render_selector, render_spark_applications

log = logging.getLogger("glasspipe.controller")

SPARK_GROUP, SPARK_VERSION = SPARK_API_VERSION.split("/")

# post_event(pipeline_body, type, reason, message): kopf.event in the operator, a list in tests.
EventPoster = Callable[[dict[str, Any], str, str, str], None]


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def _api_error(e: ApiException) -> str:
    return f"{e.status} {e.reason}: {(e.body or '')[:500]}"


def _normalized(value: Any) -> Any:
    """Drop empty strings/None so that values defaulted by the API server compare equal to ours."""
    if isinstance(value, dict):
        return {k: _normalized(v) for k, v in value.items() if v not in ("", None)}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


@dataclass
class _Slot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    dirty: bool = False


class Reconciler:
    """Converges pipelines through a synchronous Kubernetes client (called from kopf's worker threads)."""

    def __init__(self, api: client.ApiClient, post_event: EventPoster | None = None) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.post_event = post_event
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._slots_lock = threading.Lock()
        self._invalid: dict[tuple[str, str], str | None] = {}

    # ------------------------------------------------------------------------------ triggering

    def _slot(self, namespace: str, name: str) -> _Slot:
        with self._slots_lock:
            return self._slots.setdefault((namespace, name), _Slot())

    def trigger(self, namespace: str, name: str) -> None:
        """Reconcile now, or make the run in progress for this pipeline go around once more."""
        slot = self._slot(namespace, name)
        slot.dirty = True
        while slot.dirty:
            if not slot.lock.acquire(blocking=False):
                return  # the holder sees dirty=True after its run and repeats it
            try:
                while slot.dirty:
                    slot.dirty = False
                    self.reconcile(namespace, name)
            finally:
                slot.lock.release()

    # ---------------------------------------------------------------------------- API helpers

    def get_pipeline(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return cast(dict[str, Any], self.custom.get_namespaced_custom_object(
                models.GROUP, models.VERSION, namespace, models.PLURAL, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list_apps(self, namespace: str, name: str, uid: str) -> list[dict[str, Any]]:
        """The pipeline's SparkApplications: carrying its label and owned by this very object (uid)."""
        res = cast(dict[str, Any], self.custom.list_namespaced_custom_object(
            SPARK_GROUP, SPARK_VERSION, namespace, SPARK_PLURAL, label_selector=f"{PIPELINE_LABEL}={name}"))
        return [a for a in res.get("items", []) if _owned_by(a, uid)]

    def delete_app(self, namespace: str, name: str) -> None:
        try:
            self.custom.delete_namespaced_custom_object(
                SPARK_GROUP, SPARK_VERSION, namespace, SPARK_PLURAL, name,
                body=client.V1DeleteOptions(propagation_policy="Background"))
            metrics.CHILD_OPERATIONS.labels("delete").inc()
            log.info("deleted SparkApplication %s/%s", namespace, name)
        except ApiException as e:
            if e.status != 404:
                raise

    def create_app(self, namespace: str, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(SPARK_GROUP, SPARK_VERSION, namespace, SPARK_PLURAL, body)
        metrics.CHILD_OPERATIONS.labels("create").inc()
        log.info("created SparkApplication %s/%s", namespace, body["metadata"]["name"])

    # ------------------------------------------------------------------------------ reconcile

    def reconcile(self, namespace: str, name: str) -> None:
        """One full pass; API failures end up in status (Degraded) and in the error metric."""
        started = time.monotonic()
        result = "ok"
        try:
            result = self._reconcile(namespace, name)
        except Exception:
            result = "error"
            metrics.RECONCILE_ERRORS.inc()
            log.exception("reconciling GlassPipeline %s/%s failed", namespace, name)
        finally:
            metrics.RECONCILES.labels(result).inc()
            metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)

    def _reconcile(self, namespace: str, name: str) -> str:
        pipeline = self.get_pipeline(namespace, name)
        if pipeline is None:
            metrics.forget_pipeline(namespace, name)
            return "ok"
        meta = pipeline["metadata"]
        if meta.get("deletionTimestamp"):
            return "ok"  # the delete handler owns a pipeline being deleted
        uid, generation = meta["uid"], meta.get("generation")
        status = pipeline.get("status") or {}

        if not status.get("conditions"):  # first visit: say so before doing anything
            first = cond.merge_conditions([], cond.unknown_conditions(), generation, cond.now_rfc3339())
            self.patch_status(namespace, name, {"conditions": first, "selector": render_selector(name)})
            status = {**status, "conditions": first}

        raw_spec = pipeline.get("spec") or {}
        apps = self.list_apps(namespace, name, uid)
        result, error, invalid = "ok", None, None
        try:
            spec, _ = validate_spec(raw_spec)
        except SpecInvalid as e:
            invalid, result = str(e), "invalid_spec"
            if self._invalid.get((namespace, name)) != invalid:  # once per distinct problem, not per pass
                log.warning("GlassPipeline %s/%s has an invalid spec: %s", namespace, name, e)
        self._invalid[(namespace, name)] = invalid

        if invalid is not None:
            # Nothing is created, changed or deleted: running replicas keep running the last good spec.
            observed = [cond.observe_app(a, replica_index(a), True) for a in apps]
            assessment = cond.assess(len(apps), observed, invalid=invalid)
            desired_count = len(apps)
        else:
            desired = render_spark_applications(namespace, name, uid, spec)
            plan = plan_children(desired, apps)
            try:
                for app_name in plan.delete:
                    self.delete_app(namespace, app_name)
                for body in plan.create:
                    self.create_app(namespace, body)
            except ApiException as e:
                error, result = f"Kubernetes API call failed: {_api_error(e)}", "error"
                metrics.RECONCILE_ERRORS.inc()
                log.error("GlassPipeline %s/%s: %s", namespace, name, error)
            if plan.delete or plan.create or error:
                apps = self.list_apps(namespace, name, uid)
            hashes = {d["metadata"]["name"]: spec_hash_of(d) for d in desired}
            observed = [
                cond.observe_app(a, replica_index(a), hashes.get(a["metadata"]["name"]) == spec_hash_of(a))
                for a in apps
            ]
            desired_count = len(desired)
            assessment = cond.assess(desired_count, observed, suspended=spec.suspend, error=error)

        metrics.READY_REPLICAS.labels(namespace, name).set(assessment.ready_replicas)
        metrics.DESIRED_REPLICAS.labels(namespace, name).set(desired_count)
        self.write_status(pipeline, status, assessment, generation)
        return result

    def write_status(
        self, pipeline: dict[str, Any], old: dict[str, Any], a: cond.Assessment, generation: int | None
    ) -> None:
        namespace, name = pipeline["metadata"]["namespace"], pipeline["metadata"]["name"]
        conditions = cond.merge_conditions(old.get("conditions"), a.conditions, generation, cond.now_rfc3339())
        new = {
            "observedGeneration": generation,
            "conditions": conditions,
            "replicas": a.replicas,
            "readyReplicas": a.ready_replicas,
            "selector": render_selector(name),
            "replicaStatuses": a.replica_statuses,
        }
        if all(_normalized(old.get(k)) == _normalized(v) for k, v in new.items()):
            return
        self.patch_status(namespace, name, new)
        if self.post_event is None:
            return
        for t in cond.transitions(old.get("conditions"), conditions):
            kind = "Warning" if t.warning else "Normal"
            try:
                self.post_event(pipeline, kind, t.reason, f"{t.type} is {t.new_status}: {t.message}")
            except Exception:  # events are best effort
                log.exception("could not post an event for %s/%s", namespace, name)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            models.GROUP, models.VERSION, namespace, models.PLURAL, name, {"status": status})

    # ---------------------------------------------------------------------------------- delete

    def finalize(self, namespace: str, name: str, uid: str) -> int:
        """Delete the pipeline's applications; returns how many still exist (retry until 0)."""
        with self._slot(namespace, name).lock:
            apps = self.list_apps(namespace, name, uid)
            for a in apps:
                if not a["metadata"].get("deletionTimestamp"):
                    self.delete_app(namespace, a["metadata"]["name"])
            remaining = len(self.list_apps(namespace, name, uid)) if apps else 0
        if remaining == 0:
            metrics.forget_pipeline(namespace, name)
        return remaining
