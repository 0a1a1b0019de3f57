"""The spark-operator stand-in's own state machine, on a real API server, with a tiny fake driver (no JVM).

The fake driver reads ``--config-json`` like the real job and sleeps, then exits with the code it was told;
so every restartPolicy branch is checked in seconds, before test_full_path.py relies on them.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from glasspipe.render import metrics_port
from glasspipe_dev.kube import KubeAPIServer
from operator_harness import apply_crd, spark_crd, wait_for
from spark_operator_standin import FINALIZER, StandInProcess

pytestmark = pytest.mark.e2e

SPARKAPPS = "sparkapplications.sparkoperator.k8s.io"
FAKE_DRIVER = """
import json, signal, sys, time
config = json.loads(sys.argv[sys.argv.index("--config-json") + 1])
assert "--local" in sys.argv
def on_term(*_):
    if config.get("ignore_term"):
        return
    time.sleep(config.get("term_delay", 0))  # a streaming query finishing its batch
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
print("fake driver up", flush=True)
time.sleep(config.get("sleep", 3600))
print("fake driver exits with", config.get("exit", 0), flush=True)
sys.exit(config.get("exit", 0))
"""


class Cluster:
    def __init__(self, kube: KubeAPIServer, ns: str, standin: StandInProcess) -> None:
        self.kube, self.ns, self.standin = kube, ns, standin

    def create(self, name: str, policy: dict[str, Any], driver: dict[str, Any] | None = None, **config: Any) -> None:
        app = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
               "metadata": {"name": name, "namespace": self.ns},
               "spec": {"type": "Python", "sparkVersion": "4.2.0", "mainApplicationFile": "local:///job.py",
                        "driver": driver or {}, "executor": {}, "arguments": ["--config-json", json.dumps(config)],
                        "restartPolicy": policy}}
        self.kube.kubectl("apply", "-f", "-", input=json.dumps(app))

    def get(self, name: str) -> dict[str, Any] | None:
        res = self.kube.kubectl("get", SPARKAPPS, name, "-n", self.ns, "-o", "json", check=False)
        return json.loads(res.stdout) if res.returncode == 0 else None

    def pod(self, name: str) -> dict[str, Any] | None:
        res = self.kube.kubectl("get", "pod", name, "-n", self.ns, "-o", "json", check=False)
        return json.loads(res.stdout) if res.returncode == 0 else None

    def state(self, name: str) -> tuple[str, int, str]:
        st = (self.get(name) or {}).get("status") or {}
        app = st.get("applicationState") or {}
        return app.get("state", ""), int(st.get("executionAttempts") or 0), app.get("errorMessage", "")

    def wait(self, name: str, state: str, attempts: int | None = None, timeout: float = 30) -> tuple[str, int, str]:
        def check() -> tuple[str, int, str] | None:
            got = self.state(name)
            return got if got[0] == state and (attempts is None or got[1] == attempts) else None
        try:
            return wait_for(check, f"{name} {state} (attempt {attempts})", timeout, interval=0.2)
        except BaseException:
            print(f"last state {self.state(name)}; stand-in log:\n{self.standin.log_tail(40)}")
            raise


@pytest.fixture(scope="module")
def cluster(kube: KubeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    apply_crd(kube, spark_crd(), "sparkapplications.sparkoperator.k8s.io")
    ns = f"standin-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", ns)
    work = tmp_path_factory.mktemp("standin-self")
    script = work / "fake_driver.py"
    script.write_text(FAKE_DRIVER)
    standin = StandInProcess(kube.kubeconfig, work, f"--namespace={ns}", f"--job-script={script}",
                             "--running-after=0.5", "--kill-grace=3")
    standin.start()
    try:
        yield Cluster(kube, ns, standin)
    finally:
        standin.stop()


def test_failure_without_retry_is_failed_with_the_log_tail(cluster: Cluster) -> None:
    cluster.create("never", {"type": "Never"}, sleep=5, exit=3)  # lives past --running-after on a busy box
    cluster.wait("never", "RUNNING", 1)
    _, _, error = cluster.wait("never", "FAILED", 1)
    assert "driver process exited with code 3" in error and "fake driver exits with 3" in error
    time.sleep(2)
    assert cluster.state("never")[:2] == ("FAILED", 1)
    assert FINALIZER in (cluster.get("never") or {})["metadata"]["finalizers"]


def test_on_failure_retries_then_gives_up(cluster: Cluster) -> None:
    cluster.create("retry", {"type": "OnFailure", "onFailureRetries": 1, "onFailureRetryInterval": 1},
                   sleep=0.5, exit=1)
    cluster.wait("retry", "FAILED", 2)
    # FAILING lasts only until the retry is due (1 s x 1 attempt after the submission): read it in the log.
    log = cluster.standin.log_tail(200)
    assert "retry: FAILING -> PENDING_RERUN" in log and "retry: PENDING_RERUN -> SUBMITTED" in log, log


def test_a_deleted_driver_pod_is_rerun_at_once(cluster: Cluster) -> None:
    """`kubectl delete pod` of a running driver, as the kubelet and spark-operator v2.5.2 handle it: SIGTERM,
    the pod removed once the driver has exited, FAILING on its exit code and, the retry interval counting
    from the last submission, PENDING_RERUN at once (errorMessage cleared), then one more attempt."""
    cluster.create("victim", {"type": "Always", "onFailureRetryInterval": 1}, sleep=3600)
    cluster.wait("victim", "RUNNING", 1)
    time.sleep(1.5)  # longer than onFailureRetryInterval x 1 attempt
    pid = cluster.standin.driver_pid(cluster.ns, "victim")
    assert pid is not None
    cluster.kube.kubectl("delete", "pod", "victim-driver", "-n", cluster.ns, "--wait=false")
    _, _, error = cluster.wait("victim", "RUNNING", 2)
    assert error == ""
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    log = cluster.standin.log_tail(200)
    assert "victim: driver pod deleted: SIGTERM" in log, log
    assert "victim: RUNNING -> FAILING (driver process exited with code 143" in log, log
    assert "victim: FAILING -> PENDING_RERUN" in log and "victim: PENDING_RERUN -> SUBMITTED" in log, log
    pod = cluster.pod("victim-driver")
    assert pod is not None and not pod["metadata"].get("deletionTimestamp")


def test_a_failed_submission_counts_as_a_submission_not_an_execution(cluster: Cluster) -> None:
    """A driver pod that cannot be created (a namesake pod that is not the application's is in the way):
    SUBMISSION_FAILED with executionAttempts 0 and submissionAttempts 1, retried after
    onSubmissionFailureRetryInterval x 1 without PENDING_RERUN; the retry that starts a driver is execution 1,
    submission 2."""
    blocker = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "blocked-driver", "namespace": cluster.ns},
               "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "spark"}]}}
    cluster.kube.kubectl("apply", "-f", "-", input=json.dumps(blocker))
    cluster.create("blocked", {"type": "Always", "onSubmissionFailureRetryInterval": 3}, sleep=3600)
    _, _, error = cluster.wait("blocked", "SUBMISSION_FAILED", 0)
    assert "cannot create driver pod blocked-driver: 409" in error, error
    assert (cluster.get("blocked") or {})["status"]["submissionAttempts"] == 1
    cluster.kube.kubectl("delete", "pod", "blocked-driver", "-n", cluster.ns, "--grace-period=0", "--force")
    cluster.wait("blocked", "RUNNING", 1)
    assert (cluster.get("blocked") or {})["status"]["submissionAttempts"] >= 2  # 3 should a retry beat the delete
    log = cluster.standin.log_tail(200)  # resubmitted as it stands, as reconcileFailedSubmissionSparkApplication does
    assert "blocked: SUBMISSION_FAILED -> SUBMITTED" in log and "blocked: SUBMISSION_FAILED -> PENDING_RERUN" not in log
    cluster.kube.kubectl("delete", SPARKAPPS, "blocked", "-n", cluster.ns, "--wait=false")  # one driver fewer to watch


def test_a_failed_submission_without_retries_is_failed(cluster: Cluster) -> None:
    """restartPolicy Never: SUBMISSION_FAILED, then FAILED at once (no retry left), never a driver."""
    blocker = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "once-driver", "namespace": cluster.ns},
               "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "spark"}]}}
    cluster.kube.kubectl("apply", "-f", "-", input=json.dumps(blocker))
    cluster.create("once", {"type": "Never"}, sleep=3600)
    _, _, error = cluster.wait("once", "FAILED", 0)
    assert "cannot create driver pod once-driver: 409" in error, error
    assert "once: SUBMISSION_FAILED -> FAILED" in cluster.standin.log_tail(200)
    assert cluster.standin.driver_pid(cluster.ns, "once") is None
    cluster.kube.kubectl("delete", SPARKAPPS, "once", "-n", cluster.ns, "--wait=false")


def test_always_restarts_a_completed_driver(cluster: Cluster) -> None:
    cluster.create("always", {"type": "Always", "onFailureRetryInterval": 1}, sleep=1.5, exit=0)
    wait_for(lambda: cluster.state("always")[1] >= 3, "3 executions", 30, interval=0.2)
    log = cluster.standin.log_tail(200)
    assert "always: RUNNING -> SUCCEEDING" in log and "always: SUCCEEDING -> PENDING_RERUN" in log


def test_spec_change_resubmits_and_delete_stops_the_driver(cluster: Cluster) -> None:
    cluster.create("long", {"type": "Always"}, sleep=3600)
    cluster.wait("long", "RUNNING", 1)
    first = cluster.standin.driver_pid(cluster.ns, "long")
    assert first is not None
    mark = len(cluster.standin.log_lines())
    cluster.create("long", {"type": "Always"}, sleep=3601)  # a spec change
    # until the stand-in has seen the change, the old driver's RUNNING (attempt 1) is still the status
    wait_for(lambda: any("long: RUNNING -> INVALIDATING" in line for line in cluster.standin.log_lines()[mark:]),
             "the spec change to invalidate long", 30, interval=0.2)
    cluster.wait("long", "RUNNING", 1)
    second = cluster.standin.driver_pid(cluster.ns, "long")
    assert second is not None and second != first
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)

    cluster.kube.kubectl("delete", SPARKAPPS, "long", "-n", cluster.ns, "--wait=false")
    wait_for(lambda: cluster.get("long") is None, "long to be gone", 30, interval=0.2)
    wait_for(lambda: cluster.pod("long-driver") is None, "its driver pod to be gone", 30, interval=0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(second, 0)
    assert not (Path(cluster.standin.work_dir) / cluster.ns / "long" / "driver.pid").exists()


def test_delete_lets_the_application_go_before_its_driver_stops(cluster: Cluster) -> None:
    """As the real spark-operator: deleting an application only asks for its driver pod's deletion;
    the driver runs on through its grace period, and its pod object stays until it has exited."""
    # the driver finishes its batch within the pod's grace (the stand-in's --kill-grace=3): it exits by itself, 143
    cluster.create("slow", {"type": "Always"}, sleep=3600, term_delay=2)
    cluster.wait("slow", "RUNNING", 1)
    pid = cluster.standin.driver_pid(cluster.ns, "slow")
    pod = cluster.pod("slow-driver")
    assert pid is not None and pod is not None
    assert pod["status"]["phase"] == "Running" and pod["metadata"]["labels"]["spark-role"] == "driver"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == (cluster.get("slow") or {})["metadata"]["uid"]

    cluster.kube.kubectl("delete", SPARKAPPS, "slow", "-n", cluster.ns, "--wait=false")
    wait_for(lambda: cluster.get("slow") is None, "slow to be gone", 10, interval=0.1)
    os.kill(pid, 0)  # the application is gone, its driver still runs ...
    pod = cluster.pod("slow-driver")
    assert pod is not None and pod["metadata"].get("deletionTimestamp")  # ... and its pod is terminating
    wait_for(lambda: cluster.pod("slow-driver") is None, "the driver pod to be removed", 20, interval=0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "slow: driver pid" in cluster.standin.log_tail(50) and "exited with code 143" in cluster.standin.log_tail(50)


def test_a_driver_that_ignores_sigterm_is_killed_after_the_grace_period(cluster: Cluster) -> None:
    cluster.create("stubborn", {"type": "Always"}, sleep=3600, ignore_term=True)
    cluster.wait("stubborn", "RUNNING", 1)
    pid = cluster.standin.driver_pid(cluster.ns, "stubborn")
    assert pid is not None
    started = time.monotonic()
    cluster.kube.kubectl("delete", SPARKAPPS, "stubborn", "-n", cluster.ns, "--wait=false")
    wait_for(lambda: cluster.pod("stubborn-driver") is None, "the driver pod to be removed", 30, interval=0.2)
    assert time.monotonic() - started >= 3  # --kill-grace=3
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "stubborn: driver pid" in cluster.standin.log_tail(50) and "SIGKILL" in cluster.standin.log_tail(50)


def test_the_driver_pod_declares_where_this_driver_serves_its_metrics(cluster: Cluster) -> None:
    """As the kubelet would show it: the rendered metrics port on the container and a pod IP, so that the
    operator's freshness observation reaches the local driver (http://127.0.0.1:<its --metrics-port>)."""
    template = {"spec": {"containers": [{"name": "spark-kubernetes-driver", "ports": [metrics_port()]}]}}
    cluster.create("ports", {"type": "Always"}, driver={"template": template}, sleep=3600)
    cluster.wait("ports", "RUNNING", 1)
    pod = cluster.pod("ports-driver") or {}
    [port] = pod["spec"]["containers"][0]["ports"]
    assert port["name"] == "metrics" and port["containerPort"] != 9108
    assert pod["status"]["phase"] == "Running" and pod["status"]["podIP"] == "127.0.0.1"
    pid = cluster.standin.driver_pid(cluster.ns, "ports")
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    assert f"--metrics-port={port['containerPort']}" in argv, argv
    cluster.kube.kubectl("delete", SPARKAPPS, "ports", "-n", cluster.ns, "--wait=false")
    wait_for(lambda: cluster.pod("ports-driver") is None, "its driver pod to be gone", 30, interval=0.2)
