"""The glasspipe operator as a subprocess against a real kube-apiserver, under the chart's RBAC.

Shared by tests/integration/test_operator.py and the end-to-end tests in e2e/: CRDs applied, the
chart's ServiceAccount and Role(s) from `helm template`, a ServiceAccount kubeconfig, and kubectl helpers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from glasspipe_dev.kube import KubeAPIServer, kube_bin
from glasspipe_dev.paths import cache_dir
from glasspipe_dev.process import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[1]
GP_CRD = ROOT / "crds" / "glasspipe.io_glasspipelines.yaml"
INTERVAL = 2.0  # the operator's periodic reconcile, short for tests
RELEASE = "gp"

T = TypeVar("T")


def wait_for(fn: Callable[[], T | None], what: str, timeout: float = 45.0, operator: Any = None,
             interval: float = 0.3) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except AssertionError as e:  # a check that is not true yet
            last = e
        else:
            if last:
                return last
        time.sleep(interval)
    logs = f"\noperator log:\n{operator.proc.log_tail(60)}" if operator is not None else ""
    pytest.fail(f"timed out waiting for {what}; last: {last!r}{logs}")


class Operator:
    """The operator subprocess plus kubectl helpers for one test cluster."""

    def __init__(self, kube: KubeAPIServer, kubeconfig: Path, log: Path,
                 command: Callable[[Path], list[str]] | None = None) -> None:
        self.kube = kube
        self.kubeconfig = kubeconfig
        self.log = log
        self.command = command  # argv before the operator's options, given the kubeconfig (e.g. podman run)
        self.proc: ServerProcess = None  # type: ignore[assignment]
        self.metrics_port = 0

    def start(self, extra_args: Sequence[str] = ()) -> None:
        live, self.metrics_port = free_port(), free_port()
        exe = Path(sys.executable).with_name("glasspipe-operator")
        command = (self.command(self.kubeconfig) if self.command else
                   [str(exe) if exe.exists() else shutil.which("glasspipe-operator") or "glasspipe-operator"])
        argv = [*command, "--bind-address=127.0.0.1", f"--liveness-port={live}", f"--metrics-port={self.metrics_port}",
                f"--reconcile-interval={INTERVAL}", *extra_args]
        self.proc = ServerProcess("glasspipe-operator", argv, self.log, env={"KUBECONFIG": str(self.kubeconfig)})
        self.proc.start()

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{live}/healthz", timeout=2) as r:
                return r.status == 200

        self.proc.wait_ready(healthy, 60, "(liveness endpoint)")

    def stop(self) -> None:
        self.proc.stop()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    # -- kubectl as admin (the test plays users and spark-operator)

    def k(self, *args: str, input: str | None = None) -> str:
        return self.kube.kubectl(*args, input=input).stdout

    def get(self, ns: str, what: str, name: str) -> dict[str, Any] | None:
        res = self.kube.kubectl("get", what, name, "-n", ns, "-o", "json", check=False)
        if res.returncode != 0:
            if "NotFound" in res.stderr:
                return None
            raise RuntimeError(res.stderr)
        return dict(json.loads(res.stdout))

    def pipeline(self, ns: str, name: str) -> dict[str, Any]:
        obj = self.get(ns, "glasspipelines.glasspipe.io", name)
        assert obj is not None
        return obj

    def apps(self, ns: str) -> dict[str, dict[str, Any]]:
        out = json.loads(self.k("get", "sparkapplications.sparkoperator.k8s.io", "-n", ns, "-o", "json"))
        return {a["metadata"]["name"]: a for a in out["items"]}

    def set_state(self, ns: str, app: str, state: str, error: str = "", attempts: int | None = None) -> None:
        """What spark-operator does: write status.applicationState (and executionAttempts)."""
        status: dict[str, Any] = {"applicationState": {"state": state, "errorMessage": error}, "driverInfo": {}}
        if attempts is not None:
            status["executionAttempts"] = attempts
        patch = {"status": status}
        self.k("patch", "sparkapplications.sparkoperator.k8s.io", app, "-n", ns, "--subresource=status",
               "--type=merge", "-p", json.dumps(patch))

    def condition(self, ns: str, name: str, ctype: str) -> dict[str, Any]:
        conds = {c["type"]: c for c in (self.pipeline(ns, name).get("status") or {}).get("conditions", [])}
        return dict(conds.get(ctype) or {})

    def wait_condition(self, ns: str, name: str, ctype: str, status: str, reason: str | None = None,
                       timeout: float = 45.0, message: str | None = None) -> dict[str, Any]:
        """The condition once it has this status (and reason, and ``message`` in its message): a condition
        that already matches may still carry the message of the reconciliation before the one awaited."""
        def check() -> dict[str, Any] | None:
            c = self.condition(ns, name, ctype)
            ok = (c.get("status") == status and (reason is None or c.get("reason") == reason)
                  and (message is None or message in c.get("message", "")))
            return c if ok else None
        return wait_for(check, f"{name} {ctype}={status} {reason or ''} {message or ''}", timeout, self)

    def wait_apps(self, ns: str, names: list[str], timeout: float = 45.0) -> dict[str, dict[str, Any]]:
        def check() -> list[dict[str, dict[str, Any]]] | None:
            apps = self.apps(ns)
            live = {n: a for n, a in apps.items() if not a["metadata"].get("deletionTimestamp")}
            return [apps] if sorted(live) == sorted(names) and len(apps) == len(names) else None
        return wait_for(check, f"SparkApplications {names} in {ns}", timeout, self)[0]

    def new_namespace(self) -> str:
        ns = f"gp-{uuid.uuid4().hex[:8]}"
        self.k("create", "namespace", ns)
        return ns


def spark_crd() -> Path:
    """Kubeflow spark-operator's own SparkApplication CRD (dev/install/spark-operator-crd.sh): its schema
    prunes what spark-operator would not keep, so tests see what a real cluster stores."""
    found = sorted((cache_dir() / "kube").glob("spark-operator-crds-*/sparkoperator.k8s.io_sparkapplications.yaml"))
    if not found:
        pytest.fail("spark-operator's CRD is not installed: run dev/install/spark-operator-crd.sh", pytrace=False)
    return found[-1]


def apply_crd(kube: KubeAPIServer, path: Path, name: str) -> None:
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    # Not `kubectl wait`: it fails outright while the new CRD has no status.conditions yet (and so does
    # this jsonpath, hence check=False: a large CRD such as spark-operator's takes a moment).
    jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
    wait_for(lambda: kube.kubectl("get", f"crd/{name}", "-o", f"jsonpath={jsonpath}", check=False).stdout == "True",
             f"CRD {name} to be established", timeout=60)


def chart_rbac(namespace: str) -> str:
    """The chart's ServiceAccount and RBAC exactly as `helm template` renders them."""
    res = subprocess.run(
        [str(kube_bin("helm")), "template", RELEASE, str(ROOT / "charts" / "glasspipe"), "--namespace", namespace,
         "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml"],
        capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"helm template failed: {res.stderr}")
    return res.stdout


@contextmanager
def running_operator(kube: KubeAPIServer, log: Path, command: Callable[[Path], list[str]] | None = None,
                     extra_args: Sequence[str] = ()) -> Iterator[Operator]:
    """CRDs applied, the operator running under the chart's RBAC; fails if it was ever forbidden anything.
    ``command`` runs it some other way than the local ``glasspipe-operator`` (the operator image);
    ``extra_args`` are more of its options."""
    apply_crd(kube, GP_CRD, "glasspipelines.glasspipe.io")
    apply_crd(kube, spark_crd(), "sparkapplications.sparkoperator.k8s.io")
    system_ns = f"glasspipe-system-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", system_ns)
    kube.kubectl("apply", "-f", "-", input=chart_rbac(system_ns))
    kubeconfig = kube.service_account_kubeconfig(system_ns, f"{RELEASE}-glasspipe", create=False)
    op = Operator(kube, kubeconfig, log, command)
    op.start(extra_args)
    try:
        yield op
    finally:
        op.stop()
        text = op.log.read_text(errors="replace")
        # Least privilege must still be enough: no request of the operator may have been forbidden.
        assert "forbidden" not in text.lower(), f"the operator hit RBAC denials:\n{op.proc.log_tail(80)}"


def driver_pod_manifest(ns: str, app: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """The driver pod spark-operator makes for ``app``: ``<app>-driver`` with the app's driver labels and
    spark-role=driver, owned by the app, on a node with no kubelet (its status is patched by the test)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{app['metadata']['name']}-driver", "namespace": ns,
                         "labels": {**app["spec"]["driver"]["labels"], "spark-role": "driver"},
                         "ownerReferences": [{"apiVersion": app["apiVersion"], "kind": "SparkApplication",
                                              "name": app["metadata"]["name"], "uid": app["metadata"]["uid"],
                                              "controller": True}]},
            "spec": {"nodeName": "no-kubelet", "containers": [{"image": "x", **container}]}}

