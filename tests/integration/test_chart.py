"""The Helm chart against the project's real kube-apiserver: lint, dry run, install, upgrade, reconcile.

This API server has no kubelet and no controller-manager: Deployments never get pods, so `helm install`
and `helm upgrade` run WITHOUT --wait (readiness can never come) and the `helm test` hook Pod is only
checked to render and be accepted by the API server (server-side dry run); running it needs a real node.
The operator itself then runs as a subprocess with the installed ServiceAccount's token and the
installed Deployment's arguments, and must reconcile an example into the exact rendered SparkApplications.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from glasspipe import contract
from glasspipe.api.validation import validate_spec
from glasspipe.render import render_spark_applications
from glasspipe_dev.kube import KubeAPIServer, kube_bin
from glasspipe_dev.paths import cache_dir
from operator_harness import Operator, apply_crd, spark_crd, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "glasspipe"
EXAMPLE = ROOT / "examples" / "sms-dedup.yaml"
CRD_NAME = "glasspipelines.glasspipe.io"


class Helm:
    """Our helm binary against the test API server, with its own config/cache/data folders."""

    def __init__(self, kube: KubeAPIServer, home: Path) -> None:
        self.kube = kube
        self.env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig),
                    "HELM_CONFIG_HOME": str(home / "config"), "HELM_CACHE_HOME": str(home / "cache"),
                    "HELM_DATA_HOME": str(home / "data")}

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([str(kube_bin("helm")), *args], capture_output=True, text=True, env=self.env,
                             timeout=120, check=False)
        if check and res.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({res.returncode}):\n{res.stderr}{res.stdout}")
        return res


@pytest.fixture(scope="module")
def helm(kube: KubeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(kube, tmp_path_factory.mktemp("helm"))


def namespace(kube: KubeAPIServer, prefix: str) -> str:
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", ns)
    return ns


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


ALL_ON = ["--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.podMonitor.enabled=true"]


# --------------------------------------------------------------------------------------------- lint


def test_lint_strict_passes_and_schema_rejects_bad_values(helm: Helm) -> None:
    helm.run("lint", "--strict", str(CHART))
    helm.run("lint", "--strict", str(CHART), *ALL_ON, "--set", "watchNamespaces={a,b}",
             "--set", "spark.jobNamespaces={a}")
    bad = helm.run("lint", "--strict", str(CHART), "--set", "metrics.port=eighty", check=False)
    assert bad.returncode != 0 and "/metrics/port" in bad.stdout + bad.stderr
    typo = helm.run("template", "x", str(CHART), "--set", "watchNamespace={a}", check=False)
    assert typo.returncode != 0 and "watchNamespace" in typo.stderr


def monitoring_crds() -> list[Path]:
    """ServiceMonitor/PodMonitor CRDs of the real Prometheus Operator (dev/install/monitoring-crds.sh)."""
    found = sorted((cache_dir() / "kube").glob("prometheus-operator-crds-*/monitoring.coreos.com_*.yaml"))
    if len(found) < 2:
        pytest.fail("Prometheus Operator CRDs not installed: run dev/install/monitoring-crds.sh", pytrace=False)
    return found


def test_monitors_render_only_when_asked(kube: KubeAPIServer, helm: Helm) -> None:
    def kinds(*extra: str) -> list[str]:
        return [d["kind"] for d in docs(helm.run("template", "gp", str(CHART), *extra).stdout)]

    assert not {"ServiceMonitor", "PodMonitor"} & set(kinds())
    on = docs(helm.run("template", "gp", str(CHART), *ALL_ON).stdout)
    monitors = {d["kind"]: d for d in on if d["kind"] in ("ServiceMonitor", "PodMonitor")}
    assert set(monitors) == {"ServiceMonitor", "PodMonitor"}
    service = next(d for d in on if d["kind"] == "Service")
    assert monitors["ServiceMonitor"]["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert monitors["PodMonitor"]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/managed-by"] == \
        "glasspipe-operator"
    # The drivers are scraped on the port the render declares by name, not through spark-ui's address.
    [endpoint] = monitors["PodMonitor"]["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == contract.JOB_METRICS_PORT_NAME and "relabelings" not in endpoint
    # The real CRDs validate every field (a misspelt or removed field is rejected: strict field validation).
    for crd in monitoring_crds():
        name = yaml.safe_load(crd.read_text())["metadata"]["name"]
        apply_crd(kube, crd, name)
    manifest = "\n---\n".join(yaml.safe_dump(m) for m in monitors.values())
    def dry_run() -> bool:
        # Retried briefly: a just-established CRD's schema reaches server-side apply a moment later.
        res = kube.kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict", "-n", "default",
                           "-f", "-", input=manifest, check=False)
        assert res.returncode == 0 and res.stdout.count("(server dry run)") == 2, res.stdout + res.stderr
        return True

    wait_for(dry_run, "the monitors to pass a strict server-side dry run", timeout=20)


def test_dashboard_configmap_ships_the_freshness_panels(helm: Helm) -> None:
    def dashboards(*extra: str) -> list[dict[str, Any]]:
        rendered = docs(helm.run("template", "gp", str(CHART), *extra).stdout)
        return [d for d in rendered if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]

    [cm] = dashboards()
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"  # what Grafana's sidecar looks for
    dashboard = json.loads(cm["data"]["glasspipe.json"])
    exprs = {p["title"]: " ".join(t["expr"] for t in p.get("targets", [])) for p in dashboard["panels"]}
    latency = exprs["End-to-end latency (Kafka append to ClickHouse commit)"]
    assert "glasspipe_end_to_end_latency_seconds_bucket" in latency
    assert "glasspipe_event_time_lag_seconds_bucket" in exprs["Event-time lag at commit"]
    assert "glasspipe_last_committed_event_time_seconds" in exprs["Event-time staleness now, per replica"]
    assert dashboards("--set", "grafana.dashboard.enabled=false") == []


# --------------------------------------------------------------------------------------------- dry run


def test_template_applies_with_server_side_dry_run(kube: KubeAPIServer, helm: Helm) -> None:
    release_ns, job_ns = namespace(kube, "gp-sys"), namespace(kube, "gp-jobs")
    rendered = helm.run("template", "gp", str(CHART), "--namespace", release_ns, "--include-crds",
                        "--set", f"watchNamespaces={{{job_ns}}}", "--set", f"spark.jobNamespaces={{{job_ns}}}").stdout
    objs = docs(rendered)
    kinds = sorted({d["kind"] for d in objs})
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount", "Role", "RoleBinding", "ClusterRole",
            "ConfigMap", "Service", "Pod"} <= set(kinds), kinds
    # The CRD first (the rest does not depend on it, but a dry run of a CRD update must validate too).
    res = kube.kubectl("apply", "--server-side", "--dry-run=server", "--force-conflicts",
                       "--field-manager=helm-dry-run", "-f", "-", input=rendered)
    applied = [line for line in res.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == len(objs), res.stdout
    # The helm test hook is among them: accepted by the API server, run only on a real node.
    hook = next(d for d in objs if d["kind"] == "Pod")
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert any(f"pod/{hook['metadata']['name']}" in line for line in applied)


# --------------------------------------------------------------------------------------------- install


@pytest.fixture(scope="module")
def installed(kube: KubeAPIServer, helm: Helm) -> Iterator[dict[str, str]]:
    """`helm install` (no --wait: no kubelet here, the Deployment can never become ready)."""
    apply_crd(kube, spark_crd(), "sparkapplications.sparkoperator.k8s.io")  # spark-operator's own CRD
    release_ns, job_ns = namespace(kube, "gp-sys"), namespace(kube, "gp-jobs")
    release = f"gp{uuid.uuid4().hex[:4]}"
    helm.run("install", release, str(CHART), "--namespace", release_ns, "--set", f"spark.jobNamespaces={{{job_ns}}}")
    try:
        yield {"release": release, "ns": release_ns, "jobs": job_ns}
    finally:
        helm.run("uninstall", release, "--namespace", release_ns, check=False)


def get(kube: KubeAPIServer, what: str, name: str, ns: str | None = None) -> dict[str, Any]:
    args = ["get", what, name, "-o", "json", *(["-n", ns] if ns else [])]
    return dict(json.loads(kube.kubectl(*args).stdout))


def test_install_creates_everything(kube: KubeAPIServer, helm: Helm, installed: dict[str, str]) -> None:
    rel, ns, jobs = installed["release"], installed["ns"], installed["jobs"]
    status = json.loads(helm.run("status", rel, "-n", ns, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed" and status["version"] == 1
    hooks = docs(helm.run("get", "hooks", rel, "-n", ns).stdout)
    assert [(h["kind"], h["metadata"]["annotations"]["helm.sh/hook"]) for h in hooks] == [("Pod", "test")]
    dep = get(kube, "deployment", f"{rel}-glasspipe", ns)
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "glasspipe/operator:0.1.0"
    # Pipelines without spec.spark.image get the chart's Spark image, by default the one the code knows.
    assert f"--spark-image={contract.DEFAULT_SPARK_IMAGE}" in container["args"]
    assert "--freshness-interval=30" in container["args"]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == f"{rel}-glasspipe"
    assert get(kube, "crd", CRD_NAME)["spec"]["names"]["shortNames"] == ["gp"]
    # Spark driver identity in the job namespace, with exactly the rights the driver uses.
    get(kube, "serviceaccount", "spark-operator-spark", jobs)
    role = get(kube, "role", f"{rel}-glasspipe-spark", jobs)
    assert set(role["rules"][0]["resources"]) == {"pods", "services", "configmaps", "persistentvolumeclaims"}
    can = kube.kubectl("auth", "can-i", "create", "pods", "-n", jobs,
                       f"--as=system:serviceaccount:{jobs}:spark-operator-spark", check=False)
    assert can.stdout.strip() == "yes"
    dashboard = get(kube, "configmap", f"{rel}-glasspipe-dashboard", ns)
    assert json.loads(dashboard["data"]["glasspipe.json"])["uid"] == "glasspipe"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_upgrade_then_operator_reconciles_under_installed_rbac(
        kube: KubeAPIServer, helm: Helm, installed: dict[str, str], tmp_path: Path) -> None:
    rel, ns, jobs = installed["release"], installed["ns"], installed["jobs"]
    # The CRD upgrade command from docs/operations.md: Helm itself never touches crds/ on upgrade.
    crds = helm.run("show", "crds", str(CHART)).stdout
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=crds)
    helm.run("upgrade", rel, str(CHART), "--namespace", ns, "--reuse-values",
             "--set", f"watchNamespaces={{{jobs}}}", "--set", "reconcileInterval=2",
             "--set", "spark.image.repository=registry.example/team/spark", "--set", "spark.image.tag=4.2-gp7",
             "--set", "spark.serviceAccount.annotations.example\\.com/checkpoints=s3-writer")
    status = json.loads(helm.run("status", rel, "-n", ns, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed" and status["version"] == 2
    sa = get(kube, "serviceaccount", "spark-operator-spark", jobs)
    assert sa["metadata"]["annotations"]["example.com/checkpoints"] == "s3-writer"
    # Namespaced mode after the upgrade: a RoleBinding in the job namespace, no cluster-wide binding.
    get(kube, "rolebinding", f"{rel}-glasspipe", jobs)
    assert kube.kubectl("get", "clusterrolebinding", f"{rel}-glasspipe", check=False).returncode != 0

    dep = get(kube, "deployment", f"{rel}-glasspipe", ns)
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={jobs}" in args and "--reconcile-interval=2" in args
    image = "registry.example/team/spark:4.2-gp7"
    assert f"--spark-image={image}" in args
    passed_on = [a for a in args if a.startswith(("--namespace=", "--peering=", "--spark-image="))]

    kubeconfig = kube.service_account_kubeconfig(ns, f"{rel}-glasspipe", create=False)
    op = Operator(kube, kubeconfig, tmp_path / "operator.log")
    op.start(passed_on)
    try:
        pipeline = yaml.safe_load(EXAMPLE.read_text())
        kube.kubectl("apply", "-n", jobs, "-f", "-", input=json.dumps(pipeline))
        apps = op.wait_apps(jobs, ["sms-dedup-0"])
        obj = op.pipeline(jobs, "sms-dedup")
        spec, _ = validate_spec(obj["spec"])
        assert "image" not in obj["spec"]["spark"]  # the example names none: the chart's value applies
        want = render_spark_applications(jobs, "sms-dedup", obj["metadata"]["uid"], spec, image)[0]
        assert apps["sms-dedup-0"]["spec"] == want["spec"] and want["spec"]["image"] == image
        assert apps["sms-dedup-0"]["metadata"]["annotations"] == want["metadata"]["annotations"]
        # The driver's ServiceAccount the render names is the one this chart created.
        assert want["spec"]["driver"]["serviceAccount"] == "spark-operator-spark"
        op.set_state(jobs, "sms-dedup-0", "RUNNING")
        op.wait_condition(jobs, "sms-dedup", "Ready", "True", "AllReplicasRunning")
        kube.kubectl("delete", "glasspipelines.glasspipe.io", "sms-dedup", "-n", jobs, "--wait=true", timeout=90)
        wait_for(lambda: op.apps(jobs) == {}, "the operator to delete its SparkApplications", operator=op)
    finally:
        op.stop()
    log = op.log.read_text(errors="replace")
    assert "forbidden" not in log.lower(), f"the operator hit RBAC denials:\n{op.proc.log_tail(80)}"
