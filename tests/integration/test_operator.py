"""The operator against a real kube-apiserver, running as `glasspipe-operator` under the chart's RBAC.

The test plays spark-operator: it patches SparkApplication status the way spark-operator would and
checks that the GlassPipeline's conditions, counters and replica states follow. There is no garbage
collector in the test cluster, so deletions seen here are the operator's own.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from glasspipe.api.validation import validate_spec
from glasspipe.render import SPEC_HASH_ANNOTATION, render_spark_applications
from glasspipe_dev.kube import KubeAPIServer, kube_bin
from operator_harness import INTERVAL, RELEASE, ROOT, Operator, driver_pod_manifest, running_operator, wait_for

pytestmark = pytest.mark.integration

EXAMPLE = ROOT / "examples" / "filter-mapping.yaml"


@pytest.fixture(scope="module")
def operator(kube: KubeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    with running_operator(kube, tmp_path_factory.mktemp("operator") / "operator.log") as op:
        yield op


def new_namespace(op: Operator) -> str:
    return op.new_namespace()


def create_pipeline(op: Operator, ns: str, name: str = "pay", **spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": name, "namespace": ns}
    doc["spec"].update(spec)
    op.k("apply", "-f", "-", input=json.dumps(doc))
    return op.pipeline(ns, name)


def expected_apps(op: Operator, ns: str, name: str) -> dict[str, dict[str, Any]]:
    obj = op.pipeline(ns, name)
    spec, _ = validate_spec(obj["spec"])
    return {a["metadata"]["name"]: a for a in render_spark_applications(ns, name, obj["metadata"]["uid"], spec)}


def run_all(op: Operator, ns: str, state: str = "RUNNING") -> None:
    for app in op.apps(ns):
        op.set_state(ns, app, state)


# --------------------------------------------------------------------------------------------- tests


def test_create_renders_apps_and_reports_status(operator: Operator) -> None:
    op, ns = operator, new_namespace(operator)
    created = create_pipeline(op, ns)
    apps = op.wait_apps(ns, ["pay-0", "pay-1"])
    want = expected_apps(op, ns, "pay")
    for name, app in apps.items():
        assert app["spec"] == want[name]["spec"]
        assert app["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == want[name]["metadata"]["annotations"][
            SPEC_HASH_ANNOTATION]
        assert app["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]

    op.wait_condition(ns, "pay", "Progressing", "True", "ReplicasStarting")
    status = op.pipeline(ns, "pay")["status"]
    assert status["observedGeneration"] == created["metadata"]["generation"]
    assert status["selector"] == "glasspipe.io/pipeline=pay"
    assert (status["replicas"], status["readyReplicas"]) == (2, 0)
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "False", "Progressing": "True", "Degraded": "False"}
    assert all(c["observedGeneration"] == created["metadata"]["generation"] for c in status["conditions"])
    # The pipeline's spec is the user's: the operator wrote only metadata bookkeeping and status.
    assert op.pipeline(ns, "pay")["spec"] == created["spec"]

    op.set_state(ns, "pay-0", "SUBMITTED")
    op.set_state(ns, "pay-1", "RUNNING")
    op.wait_condition(ns, "pay", "Progressing", "True", "ReplicasStarting")
    op.set_state(ns, "pay-0", "RUNNING")
    ready = op.wait_condition(ns, "pay", "Ready", "True", "AllReplicasRunning")
    status = op.pipeline(ns, "pay")["status"]
    assert status["readyReplicas"] == 2
    assert [(r["index"], r["application"], r["state"]) for r in status["replicaStatuses"]] == [
        (0, "pay-0", "RUNNING"), (1, "pay-1", "RUNNING")]
    assert op.condition(ns, "pay", "Progressing")["status"] == "False"

    # Level-triggered but quiet: a few periodic passes later nothing changed (no churn, no flapping).
    versions = {n: a["metadata"]["resourceVersion"] for n, a in op.apps(ns).items()}
    time.sleep(3 * INTERVAL)
    assert {n: a["metadata"]["resourceVersion"] for n, a in op.apps(ns).items()} == versions
    assert op.condition(ns, "pay", "Ready")["lastTransitionTime"] == ready["lastTransitionTime"]

    events = json.loads(op.k("get", "events", "-n", ns, "-o", "json"))["items"]
    assert any(e["reason"] == "AllReplicasRunning" and e["involvedObject"]["name"] == "pay" for e in events)
    metrics = op.metrics()
    assert 'glasspipe_operator_reconciles_total{result="ok"}' in metrics
    assert f'glasspipe_pipeline_ready_replicas{{namespace="{ns}",pipeline="pay"}} 2.0' in metrics


def test_scale_up_and_down_is_stop_first(operator: Operator) -> None:
    op, ns = operator, new_namespace(operator)
    create_pipeline(op, ns)
    old = op.wait_apps(ns, ["pay-0", "pay-1"])
    run_all(op, ns)
    op.wait_condition(ns, "pay", "Ready", "True")

    op.k("scale", "glasspipelines.glasspipe.io/pay", "-n", ns, "--replicas=3")
    apps = op.wait_apps(ns, ["pay-0", "pay-1", "pay-2"])
    # Every replica was replaced (its partition share changed), none kept its old object.
    assert all(apps[n]["metadata"]["uid"] != old[n]["metadata"]["uid"] for n in old)
    want = expected_apps(op, ns, "pay")
    assert {n: a["spec"] for n, a in apps.items()} == {n: a["spec"] for n, a in want.items()}
    assert json.loads(apps["pay-2"]["spec"]["arguments"][1])["replicas"] == 3
    status = op.pipeline(ns, "pay")["status"]
    assert status["replicas"] == 3
    op.wait_condition(ns, "pay", "Ready", "False")
    run_all(op, ns)
    op.wait_condition(ns, "pay", "Ready", "True", "AllReplicasRunning")
    scale = json.loads(op.k("get", "--raw", f"/apis/glasspipe.io/v1alpha1/namespaces/{ns}/glasspipelines/pay/scale"))
    assert scale["status"]["replicas"] == 3 and scale["status"]["selector"] == "glasspipe.io/pipeline=pay"

    op.k("scale", "glasspipelines.glasspipe.io/pay", "-n", ns, "--replicas=1")
    op.wait_apps(ns, ["pay-0"])
    run_all(op, ns)
    op.wait_condition(ns, "pay", "Ready", "True")
    assert op.pipeline(ns, "pay")["status"]["replicas"] == 1

    op.k("patch", "glasspipelines.glasspipe.io", "pay", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    op.wait_apps(ns, [])
    op.wait_condition(ns, "pay", "Ready", "True", "Suspended")


def test_new_replicas_wait_until_old_drivers_are_gone(operator: Operator) -> None:
    """Stop-first: a stale application that is still there (spark-operator's finalizer, driver still
    stopping) holds back every new application until it is gone or its driver has stopped."""
    op, ns = operator, new_namespace(operator)
    create_pipeline(op, ns)
    op.wait_apps(ns, ["pay-0", "pay-1"])
    run_all(op, ns)
    op.wait_condition(ns, "pay", "Ready", "True")
    hold = json.dumps({"metadata": {"finalizers": ["test.glasspipe.io/driver-running"]}})
    op.k("patch", "sparkapplications.sparkoperator.k8s.io", "pay-0", "-n", ns, "--type=merge", "-p", hold)

    op.k("scale", "glasspipelines.glasspipe.io/pay", "-n", ns, "--replicas=3")
    wait_for(lambda: sorted(op.apps(ns)) == ["pay-0"] and op.apps(ns)["pay-0"]["metadata"].get("deletionTimestamp"),
             "pay-1 deleted and pay-0 terminating", operator=op)
    prog = op.wait_condition(ns, "pay", "Progressing", "True", "RollingOut")
    assert "stopping 1 old" in prog["message"]
    time.sleep(2 * INTERVAL)
    assert sorted(op.apps(ns)) == ["pay-0"], "new replicas started while an old driver was still running"

    # The old driver has stopped: the other replicas may start; pay-0 itself waits until it is gone.
    op.set_state(ns, "pay-0", "COMPLETED")
    wait_for(lambda: sorted(op.apps(ns)) == ["pay-0", "pay-1", "pay-2"], "pay-1 and pay-2 created", operator=op)
    op.k("patch", "sparkapplications.sparkoperator.k8s.io", "pay-0", "-n", ns, "--type=merge",
         "-p", json.dumps({"metadata": {"finalizers": None}}))
    apps = op.wait_apps(ns, ["pay-0", "pay-1", "pay-2"])
    want = expected_apps(op, ns, "pay")
    assert {n: a["spec"] for n, a in apps.items()} == {n: a["spec"] for n, a in want.items()}


def driver_pod(op: Operator, ns: str, app: dict[str, Any], phase: str = "Running") -> str:
    """What spark-operator makes for an application: a driver pod with its labels, owned by the app."""
    name = f"{app['metadata']['name']}-driver"
    pod = driver_pod_manifest(ns, app, {"name": "spark-kubernetes-driver"})
    op.k("apply", "-f", "-", input=json.dumps(pod))
    op.k("patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge",
         "-p", json.dumps({"status": {"phase": phase}}))
    return name


def test_new_replicas_wait_for_old_driver_pods(operator: Operator) -> None:
    """The real spark-operator lets a deleted application go once it has *asked* for its driver pod's
    deletion; the pod (and the driver writing to ClickHouse) lives on through its grace period."""
    op, ns = operator, new_namespace(operator)
    create_pipeline(op, ns, replicas=1)
    apps = op.wait_apps(ns, ["pay-0"])
    run_all(op, ns)
    op.wait_condition(ns, "pay", "Ready", "True")
    pod = driver_pod(op, ns, apps["pay-0"])

    op.k("scale", "glasspipelines.glasspipe.io/pay", "-n", ns, "--replicas=2")
    op.wait_apps(ns, [])  # the old application is gone (no finalizer here), its driver pod is not
    # The reconciliation that deleted the application wrote RollingOut already; the next one names the pod.
    op.wait_condition(ns, "pay", "Progressing", "True", "RollingOut",
                      message=f"waiting for old driver pod(s) {pod} to stop")
    time.sleep(2 * INTERVAL)
    assert op.apps(ns) == {}, "new replicas started while an old driver pod was still running"

    op.k("patch", "pod", pod, "-n", ns, "--subresource=status", "--type=merge",
         "-p", json.dumps({"status": {"phase": "Succeeded"}}))
    apps = op.wait_apps(ns, ["pay-0", "pay-1"])
    assert json.loads(apps["pay-1"]["spec"]["arguments"][1])["replicas"] == 2
    # A new application's own driver pod does not block anything.
    driver_pod(op, ns, apps["pay-0"])
    run_all(op, ns)
    op.wait_condition(ns, "pay", "Ready", "True")

    # Deleting the pipeline waits for running driver pods too: deleted means nothing writes any more.
    op.k("delete", "glasspipelines.glasspipe.io", "pay", "-n", ns, "--wait=false")
    op.wait_apps(ns, [])
    time.sleep(2 * INTERVAL)
    assert op.get(ns, "glasspipelines.glasspipe.io", "pay") is not None
    op.k("delete", "pod", "pay-0-driver", "-n", ns, "--grace-period=0", "--force")
    wait_for(lambda: op.get(ns, "glasspipelines.glasspipe.io", "pay") is None, "the pipeline to be gone", operator=op)


def test_drift_is_corrected(operator: Operator) -> None:
    """A hand-edited application is replaced (stop-first); lost labels and annotations are put back
    without touching the spec; an application the label selector misses is still found by name."""
    op, ns = operator, new_namespace(operator)
    create_pipeline(op, ns)
    apps = op.wait_apps(ns, ["pay-0", "pay-1"])
    run_all(op, ns)
    op.wait_condition(ns, "pay", "Ready", "True")

    op.k("label", "sparkapplications.sparkoperator.k8s.io", "pay-0", "-n", ns, "glasspipe.io/pipeline-",
         "app.kubernetes.io/name-")
    op.k("annotate", "sparkapplications.sparkoperator.k8s.io", "pay-0", "-n", ns, f"{SPEC_HASH_ANNOTATION}-")
    restored = wait_for(lambda: (a := op.apps(ns)["pay-0"])["metadata"]["labels"].get("glasspipe.io/pipeline")
                        and SPEC_HASH_ANNOTATION in a["metadata"]["annotations"] and a, "pay-0 relabelled", operator=op)
    assert restored["metadata"]["uid"] == apps["pay-0"]["metadata"]["uid"]
    assert restored["spec"] == apps["pay-0"]["spec"]
    assert restored["metadata"]["labels"] == apps["pay-0"]["metadata"]["labels"]

    edit = {"spec": {"sparkConf": {"spark.sql.shuffle.partitions": "999"}, "driver": {"memory": "9g"}}}
    op.k("patch", "sparkapplications.sparkoperator.k8s.io", "pay-1", "-n", ns, "--type=merge", "-p", json.dumps(edit))
    replaced = wait_for(lambda: (a := op.apps(ns).get("pay-1")) and a["metadata"]["uid"] != apps["pay-1"]["metadata"][
        "uid"] and a, "pay-1 replaced", operator=op)
    assert replaced["spec"] == expected_apps(op, ns, "pay")["pay-1"]["spec"]
    assert op.apps(ns)["pay-0"]["metadata"]["uid"] == apps["pay-0"]["metadata"]["uid"]
    events = json.loads(op.k("get", "events", "-n", ns, "-o", "json"))["items"]
    drift = [e for e in events if e["reason"] == "SparkApplicationDrift"]
    assert drift and drift[0]["type"] == "Warning" and "pay-1" in drift[0]["message"]
    metrics = op.metrics()
    assert 'glasspipe_operator_sparkapplication_operations_total{operation="replace_drifted"}' in metrics
    assert 'glasspipe_operator_sparkapplication_operations_total{operation="restore_metadata"}' in metrics
    run_all(op, ns)
    op.wait_condition(ns, "pay", "Ready", "True")


def test_foreign_application_with_our_name_is_degraded(operator: Operator) -> None:
    op, ns = operator, new_namespace(operator)
    foreign = {"apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication",
               "metadata": {"name": "pay-0", "namespace": ns},
               "spec": {"type": "Python", "sparkVersion": "4.2.0", "mainApplicationFile": "local:///theirs.py",
                        "driver": {}, "executor": {}}}
    op.k("apply", "-f", "-", input=json.dumps(foreign))
    create_pipeline(op, ns)
    deg = op.wait_condition(ns, "pay", "Degraded", "True", "ReconcileError")
    assert (f"SparkApplication {ns}/pay-0 already exists and is not owned by GlassPipeline {ns}/pay: "
            "delete or rename it") in deg["message"]
    assert sorted(op.apps(ns)) == ["pay-0"]
    assert op.apps(ns)["pay-0"]["spec"] == foreign["spec"], "the foreign application was changed"
    op.k("delete", "sparkapplications.sparkoperator.k8s.io", "pay-0", "-n", ns)
    op.wait_apps(ns, ["pay-0", "pay-1"])
    op.wait_condition(ns, "pay", "Degraded", "False")


def test_spark_operator_states_drive_conditions(operator: Operator) -> None:
    op, ns = operator, new_namespace(operator)
    create_pipeline(op, ns, replicas=2)
    op.wait_apps(ns, ["pay-0", "pay-1"])
    run_all(op, ns)
    op.wait_condition(ns, "pay", "Ready", "True")

    op.set_state(ns, "pay-1", "FAILING", "driver pod exited with code 1: Kafka broker not reachable")
    deg = op.wait_condition(ns, "pay", "Degraded", "True", "ReplicaFailed")
    assert "pay-1" in deg["message"] and "Kafka broker not reachable" in deg["message"]
    ready = op.condition(ns, "pay", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ReplicaFailed")
    status = op.pipeline(ns, "pay")["status"]
    assert status["readyReplicas"] == 1
    assert status["replicaStatuses"][1]["state"] == "FAILING"
    assert "Kafka broker not reachable" in status["replicaStatuses"][1]["message"]

    # spark-operator reruns it (restartPolicy Always): still Degraded until the new driver runs.
    op.set_state(ns, "pay-1", "PENDING_RERUN", attempts=1)
    deg = op.wait_condition(ns, "pay", "Degraded", "True", "ReplicaRestarting")
    assert "replica pay-1 lost its driver" in deg["message"], deg
    op.wait_condition(ns, "pay", "Progressing", "True", "ReplicasStarting")
    op.set_state(ns, "pay-1", "SUBMITTED", attempts=2)
    deg = op.wait_condition(ns, "pay", "Degraded", "True", "ReplicaRestarting")
    assert "resubmitted (execution attempt 2)" in deg["message"], deg
    op.set_state(ns, "pay-1", "RUNNING", attempts=2)
    op.wait_condition(ns, "pay", "Ready", "True")
    op.wait_condition(ns, "pay", "Degraded", "False")
    # A first submission is only starting.
    op.set_state(ns, "pay-1", "SUBMITTED", attempts=1)
    op.wait_condition(ns, "pay", "Progressing", "True", "ReplicasStarting")
    assert op.condition(ns, "pay", "Degraded")["status"] == "False"
    op.set_state(ns, "pay-1", "RUNNING", attempts=1)
    op.wait_condition(ns, "pay", "Ready", "True")

    op.set_state(ns, "pay-0", "FAILED", "application failed after 3 attempts")
    deg = op.wait_condition(ns, "pay", "Degraded", "True", "ReplicaFailed")
    assert "pay-0 is FAILED: application failed after 3 attempts" in deg["message"]

    def warned() -> bool:
        events = json.loads(op.k("get", "events", "-n", ns, "-o", "json"))["items"]
        return any(e["type"] == "Warning" and e["reason"] == "ReplicaFailed" for e in events)
    wait_for(warned, "a Warning event ReplicaFailed", operator=op)


def test_invalid_spec_is_degraded_and_changes_nothing(operator: Operator) -> None:
    op, ns = operator, new_namespace(operator)
    create_pipeline(op, ns)
    op.wait_apps(ns, ["pay-0", "pay-1"])
    run_all(op, ns)
    op.wait_condition(ns, "pay", "Ready", "True")
    before = {n: a["metadata"]["resourceVersion"] for n, a in op.apps(ns).items()}

    # Passes the CRD's schema and CEL rules, fails deep validation (not Spark SQL); also a rescale,
    # which must not be acted on either.
    op.k("patch", "glasspipelines.glasspipe.io", "pay", "-n", ns, "--type=json", "-p", json.dumps([
        {"op": "replace", "path": "/spec/sources/0/filter", "value": "state = = 'settled'"},
        {"op": "replace", "path": "/spec/replicas", "value": 4}]))
    deg = op.wait_condition(ns, "pay", "Degraded", "True", "InvalidSpec")
    assert "spec.sources[0].filter" in deg["message"]
    status = op.pipeline(ns, "pay")["status"]
    assert status["observedGeneration"] == op.pipeline(ns, "pay")["metadata"]["generation"]
    assert status["replicas"] == 2 and status["readyReplicas"] == 2
    time.sleep(2 * INTERVAL)
    assert {n: a["metadata"]["resourceVersion"] for n, a in op.apps(ns).items()} == before

    # Fixing the spec lets the operator act again (here: the rescale to 4).
    op.k("patch", "glasspipelines.glasspipe.io", "pay", "-n", ns, "--type=json",
         "-p", json.dumps([{"op": "replace", "path": "/spec/sources/0/filter", "value": "state = 'settled'"}]))
    op.wait_apps(ns, ["pay-0", "pay-1", "pay-2", "pay-3"])
    op.wait_condition(ns, "pay", "Degraded", "False")


def test_restart_makes_no_duplicates_and_no_churn(operator: Operator) -> None:
    op, ns = operator, new_namespace(operator)
    create_pipeline(op, ns)
    op.wait_apps(ns, ["pay-0", "pay-1"])
    run_all(op, ns)
    op.wait_condition(ns, "pay", "Ready", "True")
    before = {n: (a["metadata"]["uid"], a["metadata"]["resourceVersion"]) for n, a in op.apps(ns).items()}
    pipeline_rv = op.pipeline(ns, "pay")["metadata"]["resourceVersion"]

    op.stop()
    op.start()
    # Let the resume handler and a few timer passes run.
    wait_for(lambda: _reconciles(op) >= 3, "3 reconciliations after the restart", operator=op)
    time.sleep(INTERVAL)
    assert {n: (a["metadata"]["uid"], a["metadata"]["resourceVersion"]) for n, a in op.apps(ns).items()} == before
    # Not even the pipeline was touched (status unchanged, no annotations rewritten).
    assert op.pipeline(ns, "pay")["metadata"]["resourceVersion"] == pipeline_rv


def _reconciles(op: Operator) -> float:
    total = 0.0
    for line in op.metrics().splitlines():
        if line.startswith("glasspipe_operator_reconciles_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_delete_removes_apps_then_the_pipeline(operator: Operator) -> None:
    op, ns = operator, new_namespace(operator)
    create_pipeline(op, ns)
    op.wait_apps(ns, ["pay-0", "pay-1"])
    assert "glasspipe.io/finalizer" in op.pipeline(ns, "pay")["metadata"]["finalizers"]
    op.k("delete", "glasspipelines.glasspipe.io", "pay", "-n", ns, "--wait=false")
    op.wait_apps(ns, [])
    wait_for(lambda: op.get(ns, "glasspipelines.glasspipe.io", "pay") is None, "the pipeline to be gone", operator=op)


def test_chart_renders_deployment_and_namespaced_rbac(kube: KubeAPIServer) -> None:
    """`helm template` (our helm binary): the Deployment runs the entry point; watchNamespaces binds per namespace;
    the API server accepts every rendered object (server-side dry run)."""
    res = subprocess.run(
        [str(kube_bin("helm")), "template", RELEASE, str(ROOT / "charts" / "glasspipe"), "--namespace", "ops",
         "--include-crds", "--set", "watchNamespaces={team-a,team-b}"],
        capture_output=True, text=True, check=True)
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    kinds = sorted((d["kind"], d["metadata"].get("namespace", "")) for d in docs)
    assert ("CustomResourceDefinition", "") in kinds
    assert [k for k in kinds if k[0] == "RoleBinding"] == [("RoleBinding", "team-a"), ("RoleBinding", "team-b")]
    assert sum(1 for k in kinds if k[0] == "ClusterRoleBinding") == 1  # CRD discovery only
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["glasspipe-operator"]
    assert "--namespace=team-a" in container["args"] and "--namespace=team-b" in container["args"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"]["type"] == "Recreate"
    for ns in ("ops", "team-a", "team-b"):
        kube.kubectl("create", "namespace", ns, check=False)
    kube.kubectl("apply", "--dry-run=server", "-f", "-", input=res.stdout)
