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
from glasspipe import freshness as fresh
from glasspipe.api import models
from glasspipe.api.validation import SpecInvalid, validate_spec
from glasspipe.contract import DEFAULT_SPARK_IMAGE
from glasspipe.controller import job_metrics, metrics
from glasspipe.controller.plan import Plan, holds, lingering_drivers, plan_children, replica_index
from glasspipe.controller.spark_operator import DRIVER_POD_LABEL
from glasspipe.controller.spark_operator import GROUP as SPARK_GROUP
from glasspipe.controller.spark_operator import PLURAL as SPARK_PLURAL
from glasspipe.controller.spark_operator import VERSION as SPARK_VERSION
from glasspipe.render import PIPELINE_LABEL, render_selector, render_spark_applications

log = logging.getLogger("glasspipe.controller")

# post_event(pipeline_body, type, reason, message): kopf.event in the operator, a list in tests.
EventPoster = Callable[[dict[str, Any], str, str, str], None]


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def driver_pod_selector(pipeline: str) -> str:
    """Driver pods of a pipeline: spark-operator labels them spark-role=driver and copies our labels."""
    return f"{PIPELINE_LABEL}={pipeline},{DRIVER_POD_LABEL}"


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


@dataclass
class _Observed:
    """The last freshness observation of a pipeline: when (monotonic), and each driver's sample (by pod uid)."""

    at: float
    samples: dict[str, fresh.JobSample]


class Reconciler:
    """Converges pipelines through a synchronous Kubernetes client (called from kopf's worker threads)."""

    def __init__(self, api: client.ApiClient, post_event: EventPoster | None = None,
                 freshness_interval: float = fresh.DEFAULT_INTERVAL,
                 spark_image: str = DEFAULT_SPARK_IMAGE) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.post_event = post_event
        self.freshness_interval = freshness_interval
        self.spark_image = spark_image  # for pipelines whose spec names no image
        self._observed: dict[tuple[str, str], _Observed] = {}
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

    def get_app(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return cast(dict[str, Any], self.custom.get_namespaced_custom_object(
                SPARK_GROUP, SPARK_VERSION, namespace, SPARK_PLURAL, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def unlisted_apps(
        self, namespace: str, uid: str, names: list[str]
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """Applications with a wanted name that the label selector missed: ours whose labels were
        removed by hand, and foreign ones (not owned by this pipeline) that block the name."""
        ours: list[dict[str, Any]] = []
        foreign: list[dict[str, Any]] = []
        for name in names:
            obj = self.get_app(namespace, name)
            if obj is None:
                continue
            (ours if _owned_by(obj, uid) else foreign).append(obj)
        return ours, [o["metadata"]["name"] for o in foreign]

    def driver_messages(self, namespace: str, pipeline: str, apps: list[dict[str, Any]]) -> dict[str, str]:
        """The failed drivers' termination messages (by application uid); pods are listed only when an
        application is failing."""
        failing = [a for a in apps if ((a.get("status") or {}).get("applicationState") or {}).get("state")
                   in cond.FAILED_STATES]
        if not failing:
            return {}
        return cond.termination_messages(self.running_driver_pods(namespace, pipeline))

    def running_driver_pods(self, namespace: str, pipeline: str) -> list[dict[str, Any]]:
        pods = self.core.list_namespaced_pod(namespace, label_selector=driver_pod_selector(pipeline))
        return [cast(dict[str, Any], self.core.api_client.sanitize_for_serialization(p)) for p in pods.items]

    def patch_app_metadata(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Restore lost labels/annotations; a metadata change does not restart the driver."""
        self.custom.patch_namespaced_custom_object(SPARK_GROUP, SPARK_VERSION, namespace, SPARK_PLURAL, name, patch)
        metrics.CHILD_OPERATIONS.labels("restore_metadata").inc()
        log.info("restored labels/annotations of SparkApplication %s/%s", namespace, name)

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
            self._observed.pop((namespace, name), None)
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
            desired = render_spark_applications(namespace, name, uid, spec, self.spark_image)
            listed = {a["metadata"]["name"] for a in apps}
            unlisted, foreign = self.unlisted_apps(
                namespace, uid, [d["metadata"]["name"] for d in desired if d["metadata"]["name"] not in listed])
            apps += unlisted
            plan = plan_children(desired, apps)
            try:
                error = self.converge(pipeline, plan, apps, foreign)
            except ApiException as e:
                error = f"Kubernetes API call failed: {_api_error(e)}"
            if error is not None:
                result = "error"
                metrics.RECONCILE_ERRORS.inc()
                log.error("GlassPipeline %s/%s: %s", namespace, name, error)
            if plan.delete or plan.create or plan.relabel or error:
                apps = self.list_apps(namespace, name, uid) + self.unlisted_apps(
                    namespace, uid, [u["metadata"]["name"] for u in unlisted])[0]
            wanted = {d["metadata"]["name"]: d["spec"] for d in desired}
            messages = self.driver_messages(namespace, name, apps)
            observed = [
                cond.observe_app(a, replica_index(a), a["metadata"]["name"] in wanted
                                 and holds(wanted[a["metadata"]["name"]], a.get("spec")), messages)
                for a in apps
            ]
            desired_count = len(desired)
            assessment = cond.assess(desired_count, observed, suspended=spec.suspend, error=error,
                                     stopping_pods=plan.lingering)

        assessment.replica_statuses = self.observe_freshness(namespace, name, apps, assessment.replica_statuses,
                                                             status.get("replicaStatuses"))
        metrics.READY_REPLICAS.labels(namespace, name).set(assessment.ready_replicas)
        metrics.DESIRED_REPLICAS.labels(namespace, name).set(desired_count)
        self.write_status(pipeline, status, assessment, generation)
        return result

    def converge(self, pipeline: dict[str, Any], plan: Plan, apps: list[dict[str, Any]],
                 foreign: list[str]) -> str | None:
        """Carry out the plan; returns what blocks it (for Degraded), or None."""
        namespace, name = pipeline["metadata"]["namespace"], pipeline["metadata"]["name"]
        for app_name in plan.drifted:
            message = (f"SparkApplication {namespace}/{app_name} no longer holds the rendered spec (edited by "
                       "hand?): replacing it")
            log.warning("GlassPipeline %s/%s: %s", namespace, name, message)
            metrics.CHILD_OPERATIONS.labels("replace_drifted").inc()
            self._event(pipeline, "Warning", "SparkApplicationDrift", message)
        for app_name in plan.delete:
            self.delete_app(namespace, app_name)
        for app_name, patch in plan.relabel.items():
            self.patch_app_metadata(namespace, app_name, patch)
        if foreign:
            return "; ".join(
                f"SparkApplication {namespace}/{n} already exists and is not owned by GlassPipeline "
                f"{namespace}/{name}: delete or rename it, or rename this pipeline" for n in foreign)
        if not plan.create:
            return None
        current = {a["metadata"]["uid"] for a in apps if a["metadata"]["name"] in plan.current}
        plan.lingering = lingering_drivers(self.running_driver_pods(namespace, name), current)
        if plan.lingering:
            log.info("GlassPipeline %s/%s: waiting for old driver pod(s) %s to stop before creating %s", namespace,
                     name, ", ".join(plan.lingering), ", ".join(b["metadata"]["name"] for b in plan.create))
            plan.waiting += [b["metadata"]["name"] for b in plan.create]
            plan.create = []
            return None
        for body in plan.create:
            self.create_app(namespace, body)
        return None

    def _event(self, pipeline: dict[str, Any], kind: str, reason: str, message: str) -> None:
        if self.post_event is None:
            return
        try:
            self.post_event(pipeline, kind, reason, message)
        except Exception:  # events are best effort
            log.exception("could not post an event for %s/%s", pipeline["metadata"]["namespace"],
                          pipeline["metadata"]["name"])

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
            fresh.PIPELINE_LAG_KEY: fresh.pipeline_lag(a.replica_statuses),
        }
        if all(_normalized(old.get(k)) == _normalized(v) for k, v in new.items()):
            return
        self.patch_status(namespace, name, new)
        for t in cond.transitions(old.get("conditions"), conditions):
            self._event(pipeline, "Warning" if t.warning else "Normal", t.reason,
                        f"{t.type} is {t.new_status}: {t.message}")

    def observe_freshness(self, namespace: str, name: str, apps: list[dict[str, Any]],
                          statuses: list[dict[str, Any]], current: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """``statuses`` with each replica's freshness: read from its driver's metrics when an observation
        is due (every ``freshness_interval`` seconds), else carried over from the ``current`` status."""
        key = (namespace, name)
        last = self._observed.get(key)
        if not statuses or not fresh.due(last.at if last else None, time.monotonic(), self.freshness_interval):
            return fresh.carried_over(statuses, current) if self.freshness_interval > 0 else list(statuses)
        app_index = {str(a["metadata"].get("uid")): replica_index(a) for a in apps
                     if not a["metadata"].get("deletionTimestamp")}
        try:
            pods = self.running_driver_pods(namespace, name)
        except ApiException as e:  # freshness is never worth failing a reconciliation: try again next time
            log.warning("GlassPipeline %s/%s: cannot list driver pods for freshness: %s", namespace, name,
                        _api_error(e))
            return fresh.carried_over(statuses, current)
        targets = fresh.driver_targets(pods, app_index)
        results = job_metrics.read_samples(targets)
        observed_at = time.time()
        previous = last.samples if last else {}
        samples: dict[str, fresh.JobSample] = {}
        entries: dict[int, dict[str, Any]] = {}
        for target, (sample, error) in zip(targets, results, strict=True):
            baseline = previous.get(target.uid)
            entries[target.index] = fresh.replica_freshness(target, observed_at, sample, baseline, error)
            if sample is not None:
                samples[target.uid] = sample
            elif target.uid in previous:  # keep the baseline: the next p95 then spans both intervals
                samples[target.uid] = previous[target.uid]
        self._observed[key] = _Observed(time.monotonic(), samples)
        return fresh.with_freshness(statuses, entries)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            models.GROUP, models.VERSION, namespace, models.PLURAL, name, {"status": status})

    # ---------------------------------------------------------------------------------- delete

    def finalize(self, namespace: str, name: str, uid: str) -> int:
        """Delete the pipeline's applications; returns how many applications and running driver pods
        are left (retry until 0), so that a deleted pipeline means no driver writes any more."""
        with self._slot(namespace, name).lock:
            apps = self.list_apps(namespace, name, uid)
            for a in apps:
                if not a["metadata"].get("deletionTimestamp"):
                    self.delete_app(namespace, a["metadata"]["name"])
            remaining = len(self.list_apps(namespace, name, uid)) if apps else 0
            remaining += len(lingering_drivers(self.running_driver_pods(namespace, name), set()))
        if remaining == 0:
            metrics.forget_pipeline(namespace, name)
            self._observed.pop((namespace, name), None)
        return remaining
