"""A local stand-in for Kubeflow spark-operator plus the kubelet, for end-to-end tests (never production).

The real spark-operator cannot run here (no cluster nodes, no images), but the glasspipe operator only
talks to it through SparkApplication objects. This stand-in watches SparkApplications
(``sparkoperator.k8s.io/v1beta2``) on a real API server and runs each one as a local process: the job's
real entry point (``python -m glasspipe_job.main``) with the application's ``spec.arguments`` plus
``--local`` (local Spark with the cached connector and JVM ops jars). Each process is a "driver pod":
its own process group, its own log file, killed as a group.

It writes ``status`` through the status subresource with spark-operator's state machine
(v1beta2 ``applicationState.state``)::

    (new) -> SUBMITTED -> RUNNING                        the process started / has lived ``running_after`` s
    RUNNING -> FAILING -> PENDING_RERUN -> SUBMITTED     exit != 0, restartPolicy Always, or OnFailure with
                                                         executionAttempts <= onFailureRetries; the rerun is
                                                         due onFailureRetryInterval * submissionAttempts s after
                                                         the last submission (so at once after a long run)
    (submission) -> SUBMISSION_FAILED -> SUBMITTED       no driver pod could be made (say a namesake's still
                                                         exists): executionAttempts stays, submissionAttempts
                                                         grows; resubmitted directly (no PENDING_RERUN) after
                                                         onSubmissionFailureRetryInterval * submissionAttempts
                                                         s, or FAILED when no retry is left
    RUNNING -> FAILED                                    exit != 0 and no retry (Never, retries used up)
    RUNNING -> SUCCEEDING -> PENDING_RERUN -> SUBMITTED  exit 0 with restartPolicy Always (at once)
    RUNNING -> COMPLETED                                 exit 0 otherwise
    spec changed -> INVALIDATING -> PENDING_RERUN -> SUBMITTED   (the old process is killed first)

as spark-operator v2.5.2 does (internal/controller/sparkapplication/controller.go, pkg/util). A submission
(new, or PENDING_RERUN) takes ``submit_seconds`` before the state moves on, as spark-submit does for the
real one (it holds the state it had until spark-submit returns). ``errorMessage`` carries the exit
code/signal and the tail of the driver's log; PENDING_RERUN clears it, as the real one does.

``kubectl delete pod`` of a running driver: the stand-in plays the kubelet and glasspipe's image (SIGTERM to
the job's Python process only, as the image's entrypoint forwards it there and not to the JVM; SIGKILL to the
whole process group after the pod's grace period, the pod object removed once the process has exited) and then
spark-operator (the exit code decides FAILING or SUCCEEDING, and with restartPolicy Always a rerun).

Driver pods, as spark-operator and the kubelet make them: each submission creates a Pod object
``<app>-driver`` (spark-operator's labels plus ``spec.driver.labels``, owned by the application, bound to
a node that does not exist) whose ``status.phase`` follows the process (Running, then Succeeded or
Failed). Deletion, as spark-operator v2 does it: the application carries the finalizer
``sparkoperator.k8s.io/finalizer``; when it is deleted the stand-in only *asks* for the driver pod's
deletion (graceful: SIGTERM to the job's Python now, SIGKILL after ``kill_grace`` s) and removes the
finalizer at once, so the application is gone while its driver may still be writing. The pod object
stays, with a deletionTimestamp, until the process has exited (the kubelet's part). A spec change is
different: spark-operator waits until the old driver's resources are gone before it resubmits.

Environment of a driver: the stand-in's own, plus JAVA_HOME / PYSPARK_PYTHON / SPARK_LOCAL_IP, plus the
``env`` of ``spec.driver.template``'s first container and ``spec.driver.env`` (literal values, and
``secretKeyRef``s read from the API server). The driver's pid (= its process group) is written to
``<work-dir>/<namespace>/<name>/driver.pid`` so that tests can crash it.

Run it: ``python -m e2e.spark_operator_standin --kubeconfig K --work-dir D [--log-file F]`` from the repo
root, or use :class:`SparkOperatorStandIn` in-process.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "dev") not in sys.path:  # glasspipe_dev (ServerProcess, java_home) lives in dev/, not in the wheel
    sys.path.insert(0, str(REPO / "dev"))

from glasspipe import contract  # noqa: E402
from glasspipe_dev.paths import java_home  # noqa: E402
from glasspipe_dev.process import ServerProcess, free_port  # noqa: E402

GROUP, VERSION, PLURAL = "sparkoperator.k8s.io", "v1beta2", "sparkapplications"
FINALIZER = "sparkoperator.k8s.io/finalizer"
NODE_NAME = "spark-operator-standin"  # no kubelet runs for it: the stand-in plays the kubelet
JOB_MODULE = "glasspipe_job.main"

SUBMITTED, RUNNING, COMPLETED, FAILED = "SUBMITTED", "RUNNING", "COMPLETED", "FAILED"
SUBMISSION_FAILED, FAILING, SUCCEEDING = "SUBMISSION_FAILED", "FAILING", "SUCCEEDING"
PENDING_RERUN, INVALIDATING = "PENDING_RERUN", "INVALIDATING"
FINISHED = frozenset({COMPLETED, FAILED})

log = logging.getLogger("spark-operator-standin")


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def spec_hash(spec: dict[str, Any]) -> str:
    """spark-operator resubmits on any spec change; a digest of the whole spec detects one."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def driver_dir(work_dir: Path, namespace: str, name: str) -> Path:
    return work_dir / namespace / name


def driver_pid(work_dir: Path, namespace: str, name: str) -> int | None:
    """The pid (= process group) of the application's running driver, if any."""
    try:
        return int((driver_dir(work_dir, namespace, name) / "driver.pid").read_text().strip())
    except (OSError, ValueError):
        return None


@dataclass
class Driver:
    """What the stand-in knows about one SparkApplication (by uid): its current driver process."""

    uid: str
    namespace: str
    name: str
    spec_hash: str
    state: str = ""
    attempts: int = 0  # status.executionAttempts: submissions that started a driver
    submissions: int = 0  # status.submissionAttempts: every submission, failed ones too; retries back off by it
    proc: ServerProcess | None = None
    started: float = 0.0
    retry_at: float | None = None
    submit_at: float | None = None  # a submission under way (spark-submit): SUBMITTED then
    submitted_at: float = 0.0  # lastSubmissionAttemptTime (monotonic): retry intervals count from it
    kill_at: float | None = None  # terminating: SIGKILL if the driver still runs then
    pod_deleted: bool = False  # its driver pod was deleted (kubectl delete pod) while it ran
    metrics_port: int = 0  # where this attempt's job serves its metrics (declared on the pod, podIP 127.0.0.1)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class SparkOperatorStandIn:
    """List+watch SparkApplications and converge local driver processes on them (level-triggered)."""

    def __init__(self, api: client.ApiClient, work_dir: Path, *, running_after: float = 3.0,
                 kill_grace: float = 10.0, driver_memory: str = "1g", namespaces: list[str] | None = None,
                 python: str = sys.executable, job_script: Path | None = None, submit_seconds: float = 0.0) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.work_dir = work_dir
        self.running_after = running_after
        self.submit_seconds = submit_seconds
        self.kill_grace = kill_grace
        self.driver_memory = driver_memory
        self.namespaces = set(namespaces or [])
        self.python = python
        self.job_script = job_script
        self.drivers: dict[str, Driver] = {}
        self.terminating: list[Driver] = []  # deleted applications whose driver has not exited yet
        self.stopping = threading.Event()

    # ------------------------------------------------------------------------------------ loop

    def run(self) -> None:
        """Until :meth:`request_stop`: list, converge every application, then watch for at most 1 s."""
        log.info("stand-in watching %s/%s %s in %s", GROUP, VERSION, PLURAL,
                 ", ".join(sorted(self.namespaces)) or "all namespaces")
        try:
            while not self.stopping.is_set():
                try:
                    rv = self.sync()
                    self._watch_once(rv)
                except Exception:
                    log.exception("sync failed; retrying")
                    self.stopping.wait(1.0)
        finally:
            self.shutdown()

    def request_stop(self) -> None:
        self.stopping.set()

    def _watch_once(self, resource_version: str) -> None:
        """Return on the first change after ``resource_version`` (or after 1 s: process exits need polling)."""
        w = watch.Watch()
        for _ in w.stream(self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                          resource_version=resource_version, timeout_seconds=1, _request_timeout=10):
            w.stop()
            break

    def sync(self) -> str:
        """One pass over every application; returns the list's resourceVersion to watch from."""
        res: dict[str, Any] = self.custom.list_cluster_custom_object(  # type: ignore[assignment]
            GROUP, VERSION, PLURAL)
        items = [a for a in res.get("items", [])
                 if not self.namespaces or a["metadata"]["namespace"] in self.namespaces]
        seen = set()
        for obj in items:
            seen.add(obj["metadata"]["uid"])
            try:
                self._sync_app(obj)
            except ApiException as e:
                if e.status not in (404, 409):  # gone or changed meanwhile: the next pass sees the news
                    log.error("%s/%s: API error %s %s", obj["metadata"]["namespace"], obj["metadata"]["name"],
                              e.status, e.reason)
            except Exception:  # one broken application must not stall the others
                log.exception("%s/%s: sync failed", obj["metadata"]["namespace"], obj["metadata"]["name"])
        for uid in [u for u in self.drivers if u not in seen]:
            # Deleted without our finalizer (or before we added it): stop the driver anyway.
            self._terminate(self.drivers.pop(uid), "its SparkApplication is gone")
        self._reap()
        return str(res["metadata"]["resourceVersion"])

    # ----------------------------------------------------------------------------- per object

    def _sync_app(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        uid, ns, name = meta["uid"], meta["namespace"], meta["name"]
        d = self.drivers.get(uid)
        if meta.get("deletionTimestamp"):
            if d is not None:
                self._terminate(self.drivers.pop(uid), "its SparkApplication is being deleted")
            if FINALIZER in (meta.get("finalizers") or []):
                self._set_finalizers(obj, [f for f in meta["finalizers"] if f != FINALIZER])
                log.info("%s/%s: driver pod deletion requested, finalizer removed", ns, name)
            return
        if FINALIZER not in (meta.get("finalizers") or []):
            self._set_finalizers(obj, [*(meta.get("finalizers") or []), FINALIZER])
        h = spec_hash(obj.get("spec") or {})
        status = obj.get("status") or {}
        if d is None:
            d = Driver(uid, ns, name, h, attempts=int(status.get("executionAttempts") or 0),
                       submissions=int(status.get("submissionAttempts") or 0))
            self.drivers[uid] = d
            prior = str((status.get("applicationState") or {}).get("state") or "")
            if prior in FINISHED:  # finished before this stand-in started: leave it be
                d.state = prior
                return
            d.submit_at = time.monotonic() + self.submit_seconds
            self._tick(d, obj)
            return
        if h != d.spec_hash:
            log.info("%s: spec changed: invalidating and resubmitting", d.key)
            self._write(d, INVALIDATING)
            self._stop_driver(d, "its spec changed")
            d.spec_hash, d.attempts, d.submissions, d.retry_at = h, 0, 0, None
            self._write(d, PENDING_RERUN)
            d.submit_at = time.monotonic() + self.submit_seconds
            self._tick(d, obj)
            return
        self._tick(d, obj)

    def _tick(self, d: Driver, obj: dict[str, Any]) -> None:
        """Advance one application: driver up, driver exited, retry due."""
        now = time.monotonic()
        if d.proc is not None and d.state in (SUBMITTED, RUNNING):
            assert d.proc.proc is not None
            rc = d.proc.proc.poll()
            if rc is None:
                self._watch_pod(d)
                if d.state == SUBMITTED and now - d.started >= self.running_after and not d.pod_deleted:
                    self._write(d, RUNNING)
                return
            self._exited(d, obj, rc)
            return
        if d.state in (FAILING, SUCCEEDING, SUBMISSION_FAILED) and d.retry_at is not None and now >= d.retry_at:
            d.retry_at = None
            if d.state != SUBMISSION_FAILED:  # a failed submission is resubmitted as it stands
                self._write(d, PENDING_RERUN)  # clears errorMessage, as resetSparkApplicationStatus does
            d.submit_at = now + self.submit_seconds
        if d.submit_at is not None and now >= d.submit_at:
            d.submit_at = None
            self._submit(d, obj)

    def _watch_pod(self, d: Driver) -> None:
        """The kubelet's part of ``kubectl delete pod``: SIGTERM to the driver when its pod is deleted,
        SIGKILL after the pod's grace period."""
        assert d.proc is not None and d.proc.proc is not None
        if not d.pod_deleted:
            try:
                pod = self.core.read_namespaced_pod(self._pod_name(d), d.namespace)
                deleted = pod.metadata is not None and pod.metadata.deletion_timestamp is not None
                grace = float((pod.metadata.deletion_grace_period_seconds if pod.metadata else None)
                              or self.kill_grace)
            except ApiException as e:
                if e.status != 404:
                    raise
                deleted, grace = True, 0.0
            if not deleted:
                return
            d.pod_deleted = True
            d.kill_at = time.monotonic() + grace
            self._sigterm(d)
            log.info("%s: driver pod deleted: SIGTERM to driver pid %d (grace %.0f s)", d.key, d.proc.proc.pid, grace)
        elif d.kill_at is not None and time.monotonic() >= d.kill_at:
            log.warning("%s: driver pid %d outlived its pod's grace period: SIGKILL", d.key, d.proc.proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(d.proc.proc.pid, signal.SIGKILL)
            d.kill_at = None

    def _exited(self, d: Driver, obj: dict[str, Any], rc: int) -> None:
        assert d.proc is not None
        tail = d.proc.log_tail(15)
        d.proc.stop()  # exited: takes its TMPDIR (the driver's scratch) with it
        d.proc = None
        self._pid_file(d).unlink(missing_ok=True)
        self._set_pod_phase(d, "Succeeded" if rc == 0 else "Failed", self._terminated(d, obj, rc))
        if d.pod_deleted:  # the kubelet removes a deleted pod once its containers have stopped
            self._delete_pod(d, grace=0)
            d.pod_deleted, d.kill_at = False, None
        policy = (obj.get("spec") or {}).get("restartPolicy") or {}
        kind = policy.get("type", "Never")
        extra = {"terminationTime": now_rfc3339()}
        if rc == 0:
            log.info("%s: driver exited with code 0", d.key)
            if kind == "Always":
                d.retry_at = time.monotonic()
                self._write(d, SUCCEEDING, extra=extra)
            else:
                self._write(d, COMPLETED, extra=extra)
            return
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
        message = f"driver process {how}; log tail:\n{tail}"[-2000:]
        log.warning("%s: driver %s", d.key, how)
        retries = policy.get("onFailureRetries")
        retry = kind == "Always" or (kind == "OnFailure" and retries is not None and d.attempts <= int(retries))
        if retry:
            interval = float(policy.get("onFailureRetryInterval", 5))
            d.retry_at = d.submitted_at + interval * max(d.submissions, 1)  # util.TimeUntilNextRetryDue
            self._write(d, FAILING, message, extra)
        else:
            self._write(d, FAILED, message, extra)

    # ------------------------------------------------------------------------------ processes

    def _pid_file(self, d: Driver) -> Path:
        return driver_dir(self.work_dir, d.namespace, d.name) / "driver.pid"

    def _submit(self, d: Driver, obj: dict[str, Any]) -> None:
        spec = obj.get("spec") or {}
        try:  # the previous attempt's pod goes first: PENDING_RERUN waits until it is gone, then submits
            self._delete_pod(d, grace=0, only_own=True)
        except ApiException as e:  # controller-runtime requeues the application: try again shortly
            d.submit_at = time.monotonic() + 1.0
            log.warning("%s: cannot delete the previous driver pod yet: %s %s", d.key, e.status, e.reason)
            return
        d.submissions += 1  # submitSparkApplication counts every submission; executionAttempts only a good one
        d.submitted_at = time.monotonic()
        d.retry_at = None
        folder = driver_dir(self.work_dir, d.namespace, d.name)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            env = self._driver_env(d.namespace, spec)
            env.update(self._secret_volumes(d.namespace, spec, folder))
        except (ApiException, KeyError, ValueError) as e:
            self._submission_failed(d, spec, f"cannot build the driver's environment: {e}")
            return
        d.metrics_port = free_port()
        try:
            self._create_pod(d, obj)
        except ApiException as e:  # e.g. a namesake's driver pod still terminating
            self._submission_failed(d, spec, f"cannot create driver pod {self._pod_name(d)}: {e.status} {e.reason}")
            return
        d.attempts += 1
        entry = [str(self.job_script)] if self.job_script else ["-m", JOB_MODULE]
        argv = [self.python, *entry, *[str(a) for a in spec.get("arguments") or []],
                "--local", f"--metrics-port={d.metrics_port}"]
        log_path = folder / f"{d.uid[:8]}-attempt-{d.attempts}.log"
        termination_log = folder / "termination-log"  # the container's /dev/termination-log
        termination_log.unlink(missing_ok=True)
        env[contract.ENV_TERMINATION_LOG] = str(termination_log)
        d.proc = ServerProcess(f"driver {d.key}", argv, log_path, env=env, cwd=folder, own_temp_dir=True).start()
        assert d.proc.proc is not None
        self._pid_file(d).write_text(f"{d.proc.proc.pid}\n")
        d.started = time.monotonic()
        # The kubelet's part: the pod runs here, so the operator reads the job's metrics at 127.0.0.1.
        self._set_pod_phase(d, "Running", {"podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]})
        log.info("%s: submitted attempt %d, pid %d, log %s", d.key, d.attempts, d.proc.proc.pid, log_path)
        self._write(d, SUBMITTED, extra={
            "lastSubmissionAttemptTime": now_rfc3339(),
            "submissionID": str(uuid.uuid4()),
            "sparkApplicationId": f"local-{d.proc.proc.pid}",
            "driverInfo": {"podName": f"{d.name}-driver"},
            "terminationTime": None,
        })

    def _submission_failed(self, d: Driver, spec: dict[str, Any], message: str) -> None:
        """SUBMISSION_FAILED: no driver, executionAttempts unchanged; a retry (util.ShouldRetry) is due
        onSubmissionFailureRetryInterval * submissionAttempts s after this submission."""
        policy = spec.get("restartPolicy") or {}
        kind, retries = policy.get("type", "Never"), policy.get("onSubmissionFailureRetries")
        retry = kind == "Always" or (kind == "OnFailure" and retries is not None and d.submissions <= int(retries))
        log.warning("%s: submission %d failed: %s", d.key, d.submissions, message)
        self._write(d, SUBMISSION_FAILED, message, {"lastSubmissionAttemptTime": now_rfc3339()})
        if retry:
            d.retry_at = d.submitted_at + float(policy.get("onSubmissionFailureRetryInterval", 20)) * d.submissions
        else:  # reconcileFailedSubmissionSparkApplication: no retry left
            self._write(d, FAILED, message, {"terminationTime": now_rfc3339()})

    def _driver_env(self, namespace: str, spec: dict[str, Any]) -> dict[str, str]:
        driver = spec.get("driver") or {}
        containers = (((driver.get("template") or {}).get("spec") or {}).get("containers")) or [{}]
        env = {
            "JAVA_HOME": java_home(),
            "PYSPARK_PYTHON": self.python,
            "PYSPARK_DRIVER_PYTHON": self.python,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "GLASSPIPE_DRIVER_MEMORY": self.driver_memory,
        }
        for item in [*(containers[0].get("env") or []), *(driver.get("env") or [])]:
            if "value" in item:
                env[item["name"]] = str(item["value"])
            elif "secretKeyRef" in (item.get("valueFrom") or {}):
                ref = item["valueFrom"]["secretKeyRef"]
                secret = self.core.read_namespaced_secret(ref["name"], namespace)
                env[item["name"]] = base64.b64decode((secret.data or {})[ref["key"]]).decode()
        return env

    def _secret_volumes(self, namespace: str, spec: dict[str, Any], folder: Path) -> dict[str, str]:
        """The kubelet's part for the driver template's Secret volumes: each mounted item is written under
        ``folder/kubelet-root`` + its mountPath (fresh per submission), and the job is told where the
        contract's Secret files folder is now (it cannot be /etc here)."""
        template = (((spec.get("driver") or {}).get("template") or {}).get("spec")) or {}
        volumes = {v["name"]: v for v in template.get("volumes") or []}
        mounts = ((template.get("containers") or [{}])[0].get("volumeMounts")) or []
        root = folder / "kubelet-root"
        shutil.rmtree(root, ignore_errors=True)
        for mount in mounts:
            source = (volumes.get(mount["name"]) or {}).get("secret")
            if source is None:
                continue
            data = self.core.read_namespaced_secret(source["secretName"], namespace).data or {}
            items = source.get("items") or [{"key": k, "path": k} for k in sorted(data)]
            target = root / mount["mountPath"].lstrip("/")
            target.mkdir(parents=True, exist_ok=True, mode=0o700)
            for item in items:
                path = target / item["path"]
                path.write_bytes(base64.b64decode(data[item["key"]]))  # KeyError: a missing key, as the kubelet
                path.chmod(0o600)
        return {contract.ENV_SECRET_FILES_DIR: str(root / contract.SECRET_FILES_DIR.lstrip("/"))} if mounts else {}

    def _stop_driver(self, d: Driver, why: str) -> None:
        """Stop the driver and wait for it (a spec change: spark-operator waits before it resubmits)."""
        if d.proc is None:
            return
        assert d.proc.proc is not None
        pid = d.proc.proc.pid
        started = time.monotonic()
        d.proc.stop(timeout=self.kill_grace, term_group=False)  # SIGTERM where the image sends it (_sigterm)
        log.info("%s: driver pid %d stopped (%s) with code %s in %.1f s", d.key, pid, why,
                 d.proc.proc.returncode, time.monotonic() - started)
        d.proc = None
        self._forget_pid(d, pid)
        self._delete_pod(d, grace=0)

    @staticmethod
    def _sigterm(d: Driver) -> None:
        """SIGTERM where glasspipe's image sends it (dev/images/spark-entrypoint.sh): to the job's Python, which
        finishes its micro-batch and stops; the JVM, its child, exits when the Python side closes its stdin."""
        assert d.proc is not None and d.proc.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(d.proc.proc.pid, signal.SIGTERM)

    def _terminate(self, d: Driver, why: str) -> None:
        """A graceful pod deletion: SIGTERM now, the pod object stays until the driver has exited."""
        if d.proc is None:
            self._delete_pod(d, grace=0)
            return
        assert d.proc.proc is not None
        self._sigterm(d)
        d.kill_at = time.monotonic() + self.kill_grace
        self._delete_pod(d, grace=int(self.kill_grace))
        self.terminating.append(d)
        log.info("%s: sent SIGTERM to driver pid %d (%s); its pod stays until it exits", d.key, d.proc.proc.pid, why)

    def _reap(self) -> None:
        """The kubelet's part of a graceful deletion: remove the pod once the driver has exited."""
        for d in list(self.terminating):
            assert d.proc is not None and d.proc.proc is not None
            pid, rc = d.proc.proc.pid, d.proc.proc.poll()
            if rc is None:
                if d.kill_at is not None and time.monotonic() >= d.kill_at:
                    log.warning("%s: driver pid %d outlived its grace period: SIGKILL", d.key, pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    d.kill_at = None
                continue
            self.terminating.remove(d)
            d.proc.stop()  # exited: takes its TMPDIR (the driver's scratch) with it
            d.proc = None
            self._forget_pid(d, pid)
            self._delete_pod(d, grace=0)
            log.info("%s: driver pid %d exited with code %s; pod removed", d.key, pid, rc)

    def _forget_pid(self, d: Driver, pid: int) -> None:
        """Remove the pid file if it is still this driver's (a namesake may have started meanwhile)."""
        if driver_pid(self.work_dir, d.namespace, d.name) == pid:
            self._pid_file(d).unlink(missing_ok=True)

    def shutdown(self) -> None:
        """Stop every driver at once (SIGTERM, SIGKILL after the grace period); API state is left as is."""
        running = [d for d in [*self.drivers.values(), *self.terminating] if d.proc is not None]
        threads = [threading.Thread(target=self._stop_driver, args=(d, "stand-in shutting down")) for d in running]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        log.info("stand-in stopped (%d driver(s) stopped)", len(running))

    # ----------------------------------------------------------------------------------- API

    def _write(self, d: Driver, state: str, error: str = "", extra: dict[str, Any] | None = None) -> None:
        """Merge-patch status (conditional on the uid, so a re-created namesake is never written)."""
        status: dict[str, Any] = {"applicationState": {"state": state, "errorMessage": error},
                                  "driverInfo": {}, "executionAttempts": d.attempts,
                                  "submissionAttempts": d.submissions, **(extra or {})}
        body = {"metadata": {"uid": d.uid}, "status": status}
        if state != d.state:
            log.info("%s: %s -> %s%s", d.key, d.state or "NEW", state, f" ({error.splitlines()[0]})" if error else "")
        d.state = state  # first: should the write fail, the local state machine still follows its driver
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, d.namespace, PLURAL, d.name, body)

    def _pod_name(self, d: Driver) -> str:
        return f"{d.name}-driver"

    def _create_pod(self, d: Driver, obj: dict[str, Any]) -> None:
        """The driver pod as spark-operator submits it: its labels, owned by the application, and the rendered
        template's container ports (the job's metrics port, here at this attempt's local port)."""
        spec = obj.get("spec") or {}
        template = (((spec.get("driver") or {}).get("template") or {}).get("spec") or {}).get("containers") or [{}]
        ports = [{**p, "containerPort": d.metrics_port} if p.get("name") == contract.JOB_METRICS_PORT_NAME else p
                 for p in template[0].get("ports") or []]
        labels = {**((spec.get("driver") or {}).get("labels") or {}), "spark-role": "driver",
                  "sparkoperator.k8s.io/app-name": d.name, "sparkoperator.k8s.io/launched-by-spark-operator": "true"}
        pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self._pod_name(d), "namespace": d.namespace, "labels": labels,
                         "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "SparkApplication",
                                              "name": d.name, "uid": d.uid, "controller": True}]},
            "spec": {"nodeName": NODE_NAME, "restartPolicy": "Never",
                     "terminationGracePeriodSeconds": int(self.kill_grace),
                     "containers": [{"name": "spark-kubernetes-driver", "image": spec.get("image") or "spark",
                                     **({"ports": ports} if ports else {})}]}}
        self.core.create_namespaced_pod(d.namespace, pod)  # type: ignore[arg-type]  # dicts are accepted

    def _terminated(self, d: Driver, obj: dict[str, Any], rc: int) -> dict[str, Any]:
        """The driver container's status as the kubelet writes it: exit code, reason and the termination
        message (what the job left in its /dev/termination-log)."""
        terminated: dict[str, Any] = {"exitCode": rc if rc >= 0 else 128 - rc, "reason": "Completed" if rc == 0
                                      else "Error", "finishedAt": now_rfc3339()}
        path = driver_dir(self.work_dir, d.namespace, d.name) / "termination-log"
        with contextlib.suppress(OSError):
            terminated["message"] = path.read_bytes()[:4096].decode(errors="replace")
        image = (obj.get("spec") or {}).get("image") or "spark"
        return {"containerStatuses": [{"name": "spark-kubernetes-driver", "ready": False, "restartCount": 0,
                                       "image": image, "imageID": "", "state": {"terminated": terminated}}]}

    def _set_pod_phase(self, d: Driver, phase: str, extra: dict[str, Any] | None = None) -> None:
        try:
            self.core.patch_namespaced_pod_status(self._pod_name(d), d.namespace,
                                                  {"status": {"phase": phase, **(extra or {})}})
        except ApiException as e:
            if e.status != 404:
                raise

    def _delete_pod(self, d: Driver, grace: int, only_own: bool = False) -> None:
        try:
            if only_own:
                pod = self.core.read_namespaced_pod(self._pod_name(d), d.namespace)
                if pod.metadata is None or d.uid not in {r.uid for r in pod.metadata.owner_references or []}:
                    return
            self.core.delete_namespaced_pod(self._pod_name(d), d.namespace, grace_period_seconds=grace)
        except ApiException as e:
            if e.status != 404:
                raise

    def _set_finalizers(self, obj: dict[str, Any], finalizers: list[str]) -> None:
        meta = obj["metadata"]
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"],
                             "uid": meta["uid"]}}
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], body)


class StandInProcess:
    """The stand-in as a subprocess (``python -m e2e.spark_operator_standin``), for test fixtures."""

    def __init__(self, kubeconfig: Path, work_dir: Path, *extra: str) -> None:
        self.work_dir = work_dir
        self.log = work_dir / "standin.log"
        argv = [sys.executable, "-m", "e2e.spark_operator_standin", f"--kubeconfig={kubeconfig}",
                f"--work-dir={work_dir}", f"--log-file={self.log}", *extra]
        self.proc = ServerProcess("spark-operator-standin", argv, work_dir / "standin.out", cwd=REPO)

    def start(self, timeout: float = 60.0) -> StandInProcess:
        self.proc.start()
        self.proc.wait_ready(lambda: "stand-in watching" in self.log.read_text(), timeout, f"(log {self.log})")
        return self

    def driver_pid(self, namespace: str, name: str) -> int | None:
        return driver_pid(self.work_dir, namespace, name)

    def log_lines(self) -> list[str]:
        try:
            return self.log.read_text(errors="replace").splitlines()
        except OSError:
            return []

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_lines()[-lines:])

    def driver_logs_tail(self, namespace: str, name: str, lines: int = 30) -> str:
        """The end of every attempt's driver log of one application: why an attempt ended, for a failed test."""
        parts = []
        for path in sorted(driver_dir(self.work_dir, namespace, name).glob("*-attempt-*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}:\n" + "\n".join(tail))
        return "\n".join(parts)

    def stop(self) -> None:
        """SIGTERM (the stand-in stops its drivers), then kill any driver left behind: no JVM outlives a test."""
        self.proc.stop(timeout=3 * 10.0 + 10)
        for pid_file in self.work_dir.glob("*/*/driver.pid"):
            with contextlib.suppress(OSError, ValueError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="spark-operator-standin", description=__doc__.split("\n")[0])
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="default: $KUBECONFIG")
    p.add_argument("--work-dir", type=Path, required=True, help="driver logs and pid files")
    p.add_argument("--log-file", type=Path, help="the stand-in's own log (default: stderr)")
    p.add_argument("-n", "--namespace", action="append", default=[], help="repeatable; default: all namespaces")
    p.add_argument("--running-after", type=float, default=3.0,
                   help="seconds a driver must live before it is reported RUNNING")
    p.add_argument("--kill-grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    p.add_argument("--submit-seconds", type=float, default=0.0,
                   help="how long a submission takes (spark-submit's time: the state stays until then)")
    p.add_argument("--driver-memory", default="1g", help="spark.driver.memory of each local driver")
    p.add_argument("--job-script", type=Path,
                   help=f"run this Python file instead of `-m {JOB_MODULE}` (the stand-in's own tests)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    handler: logging.Handler = logging.FileHandler(args.log_file) if args.log_file else logging.StreamHandler()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        handlers=[handler])
    for noisy in ("kubernetes.client.rest", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    config.load_kube_config(config_file=args.kubeconfig)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    standin = SparkOperatorStandIn(client.ApiClient(), args.work_dir.resolve(), running_after=args.running_after,
                                   kill_grace=args.kill_grace, driver_memory=args.driver_memory,
                                   namespaces=args.namespace, job_script=args.job_script,
                                   submit_seconds=args.submit_seconds)

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("got %s", signal.Signals(signum).name)
        standin.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    standin.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
