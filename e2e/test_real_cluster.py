"""The full path on real Kubernetes machinery: a kubelet with containerd and runc, the scheduler, the
controller-manager's garbage collector, the real Kubeflow spark-operator (v2.5.2, built from its Go
module) and driver pods of the project's Spark image reading the local Kafka and writing the local
ClickHouse.

`helm install` of the chart gives the CRD, the operator's ServiceAccount and RBAC, the Spark
ServiceAccount and Role in the job namespace, and the operator Deployment. The operator itself runs as a
host process under the chart's ServiceAccount token, not as the Deployment's pod: the API server of
glasspipe_dev.kube listens on 127.0.0.1 only and the node runs no kube-proxy (which would rewrite the
shared host's iptables), so a pod reaches neither the API server nor the `kubernetes` Service's
ClusterIP. spark-operator is a host process for the same reason. Driver pods need no API server: Spark
runs in local mode inside them (spec.spark.conf spark.master=local[1]), and Kafka and ClickHouse listen
on the node's address, which pods reach through the CNI bridge's gateway.
Settings for the 2-core machine: e2e/README.md.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from fixtures_cluster import import_project_image
from glasspipe.contract import G1_REGION_OPTION, IMAGE_PYTHON
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.cluster import CLUSTER_CIDR, Cluster, host_ip
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.kube import kube_bin
from glasspipe_dev.pipelines import load_example, produce, write_pipeline
from glasspipe_dev.spark_operator import SparkOperator
from operator_harness import Operator, wait_for
from test_full_path import Clock, assert_exact, batch

# Image imports, spark-submit and Spark start-up in pods: 25-35 min on the loaded 2-core machine.
# The same worker as tests/integration/test_smoke_cluster.py: one node cluster per run.
pytestmark = [pytest.mark.e2e, pytest.mark.real_cluster, pytest.mark.timeout(3600), pytest.mark.xdist_group("node")]

NAME = "sms-dedup"
RELEASE = "gp"
GP = "glasspipelines.glasspipe.io"
ROOT = Path(__file__).resolve().parents[1]
APP_TIMEOUT = 900.0  # image start-up, JVM and Spark start in a pod on a loaded 2-core box
# What one driver pod asks for: Spark in local mode with one core inside the pod, a small heap, and a
# CPU request of a quarter core so that two replicas and the operator fit a 2-core node.
SPARK_SETTINGS: dict[str, Any] = {
    "driver": {"cores": 1, "memory": "768m"},
    "executor": {"instances": 1, "cores": 1, "memory": "512m"},  # unused: no executor pods in local mode
    "conf": {
        "spark.master": "local[1]",
        "spark.kubernetes.driver.request.cores": "250m",
        "spark.ui.enabled": "false",
        # The driver JVM: C1 only and the serial collector, which start Spark faster on a saturated 2-core box;
        # -Xshare:on fails the JVM unless it maps the image's class-data-sharing archive (the product's default,
        # -Xshare:auto, would start without it silently).
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:on",
    },
}


@pytest.fixture(scope="module")
def node_kafka() -> Iterator[KafkaServer]:
    """Kafka on the node's address (pods cannot reach the host's loopback)."""
    server = KafkaServer(host=host_ip())
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def node_clickhouse() -> Iterator[ClickHouseServer]:
    """ClickHouse on the node's address, its default user allowed from the pod network."""
    server = ClickHouseServer(host=host_ip(), networks=[CLUSTER_CIDR])
    try:
        server.start()
        yield server
    finally:
        server.close()


def helm(cluster: Cluster, *args: str) -> str:
    import subprocess

    res = subprocess.run([str(kube_bin("helm")), *args], capture_output=True, text=True, timeout=300,
                         env={"KUBECONFIG": str(cluster.kubeconfig), "PATH": "/usr/bin:/bin",
                              "HOME": str(cluster.dir)})
    assert res.returncode == 0, f"helm {' '.join(args)}: {res.stderr}"
    return res.stdout


def pods(cluster: Cluster, ns: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", ns, "-l", selector, "-o", "json").stdout
    return list(json.loads(out)["items"])


_LIST_COMMAND_LINES = """
import glob, json
found = []
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        found.append(open(path, "rb").read().decode(errors="replace").split("\\0"))
    except OSError:
        pass
print(json.dumps(found))
"""


def driver_jvm_arguments(cluster: Cluster, ns: str, pod: str) -> list[str]:
    """The command line of the driver JVM in a driver pod (java running SparkSubmit), read from the pod's /proc.
    A pod is Running while spark-class still runs Spark's launcher (a java of its own, naming SparkSubmit as its
    argument), so wait for the driver's JVM itself."""
    def driver_jvm() -> list[str] | None:
        out = cluster.kubectl("exec", pod, "-n", ns, "--", IMAGE_PYTHON, "-c", _LIST_COMMAND_LINES).stdout
        jvms = [argv for argv in json.loads(out) if argv and argv[0].endswith("java")
                and "org.apache.spark.deploy.SparkSubmit" in argv and "org.apache.spark.launcher.Main" not in argv]
        assert len(jvms) <= 1, jvms
        return list(jvms[0]) if jvms else None
    return wait_for(driver_jvm, f"the driver JVM in pod {pod}", 120, interval=1.0)


def app_states(op: Operator, ns: str) -> dict[str, tuple[str, int, str]]:
    out = {}
    for name, a in op.apps(ns).items():
        if a["metadata"].get("deletionTimestamp"):
            continue
        st = a.get("status") or {}
        app_state = st.get("applicationState") or {}
        out[name] = (app_state.get("state", ""), int(st.get("executionAttempts") or 0),
                     app_state.get("errorMessage", ""))
    return out


def condition_is(op: Operator, ns: str, ctype: str, status: str, reason: str) -> dict[str, Any] | None:
    c = op.condition(ns, NAME, ctype)
    return c if (c.get("status"), c.get("reason")) == (status, reason) else None


class History:
    """``kubectl get -w`` of the namespace's SparkApplications and driver pods in the background: every
    state spark-operator wrote and every pod phase, timestamped, however short-lived (the failure
    message and the deleted-pod step print it)."""

    APP_COLUMNS = ("APP:.metadata.name,STATE:.status.applicationState.state,ATTEMPTS:.status.executionAttempts,"
                   "ERROR:.status.applicationState.errorMessage")
    POD_COLUMNS = ("POD:.metadata.name,PHASE:.status.phase,DELETING:.metadata.deletionTimestamp,"
                   "EXIT:.status.containerStatuses[0].state.terminated.exitCode,"
                   "REASON:.status.containerStatuses[0].state.terminated.reason")

    def __init__(self, cluster: Cluster, ns: str) -> None:
        self.t0 = time.monotonic()
        self.lines: list[str] = []
        self.procs: list[subprocess.Popen[str]] = []
        for kind, what, columns in (("app", ["sparkapplications"], self.APP_COLUMNS),
                                    ("pod", ["pods", "-l", "spark-role=driver"], self.POD_COLUMNS)):
            proc = subprocess.Popen(
                [str(kube_bin("kubectl")), f"--kubeconfig={cluster.kubeconfig}", "get", *what, "-n", ns, "-w",
                 "--no-headers", "-o", f"custom-columns={columns}"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.procs.append(proc)
            threading.Thread(target=self._read, args=(kind, proc), daemon=True).start()

    def _read(self, kind: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(f"{time.monotonic() - self.t0:8.1f} s {kind} {' '.join(line.split())}")

    def since(self, t: float, needle: str = "") -> str:
        return "\n".join(x for x in self.lines if float(x.split()[0]) >= t - self.t0 and needle in x)

    def text(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
            p.wait(timeout=10)


def stale_image(degraded: dict[str, Any]) -> None:
    """Fail at once, with the fix, when the driver's job rejects what the operator rendered: the image
    archive in $GLASSPIPE_CACHE/images was built from older sources (dev/setup.sh rebuilds it when its
    inputs change; a test run alone does not)."""
    if degraded.get("status") == "True" and "invalid pipeline spec" in degraded.get("message", ""):
        pytest.fail(f"the job in the Spark image rejects the rendered spec ({degraded['message']}): the image "
                    "archive is older than operator/ and sparkapp/; rebuild it with `bash dev/install/images.sh`",
                    pytrace=False)


def count(ch: ClickHouseServer, table: str) -> int:
    """Rows in ``table``; 0 until the job has created it."""
    if not ch.client().execute(f"EXISTS TABLE {table}")[0][0]:
        return 0
    return int(ch.client().execute(f"SELECT count() FROM {table}")[0][0])


def test_real_cluster_apply_scale_delete_pod_delete(
    tmp_path: Path, cluster: Cluster, node_kafka: KafkaServer, node_clickhouse: ClickHouseServer
) -> None:
    clock, rng = Clock(), random.Random(12)
    kafka, ch = node_kafka, node_clickhouse
    ns, system_ns = f"rc-{uuid.uuid4().hex[:6]}", f"glasspipe-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    clock.mark(f"cluster up (cold start {cluster.startup_seconds:.1f} s); Kafka {kafka.bootstrap}, "
               f"ClickHouse {ch.host}:{ch.port}")

    # ---- helm install: CRD, RBAC, the Spark ServiceAccount in the job namespace, the Deployment
    operator_image = import_project_image(cluster, "glasspipe-operator")
    repo, tag = operator_image.rsplit(":", 1)
    helm(cluster, "install", RELEASE, str(ROOT / "charts" / "glasspipe"), "-n", system_ns, "--create-namespace",
         "--set-json", f'watchNamespaces=["{ns}"]', "--set-json", f'spark.jobNamespaces=["{ns}"]',
         "--set", f"image.repository={repo}", "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
         "--wait=false")
    clock.mark(f"helm install {RELEASE} -n {system_ns}")
    deploy = f"{RELEASE}-glasspipe"
    kubeconfig = cluster.api.service_account_kubeconfig(system_ns, deploy, create=False)
    op = Operator(cluster.api, kubeconfig, tmp_path / "operator.log")
    op.start([f"--namespace={ns}"])
    # A submitter whose environment names a Python the image does not have (as a test session's does):
    # the rendered spark.pyspark.python must win, or the driver fails "Cannot run program".
    submitter = "/submitter/venv/bin/python"
    spark_operator = SparkOperator(cluster, [ns], env={"PYSPARK_PYTHON": submitter,
                                                       "PYSPARK_DRIVER_PYTHON": submitter}).start()
    try:
        clock.mark("operator (chart ServiceAccount) and spark-operator running as host processes")
        spark_image = import_project_image(cluster, "glasspipe-spark")
        clock.mark(f"imported {spark_image}")
        _scenario(tmp_path, cluster, op, spark_operator, kafka, ch, ns, spark_image, clock, rng,
                  lambda: _chart_pod(cluster, system_ns, deploy))
    finally:
        spark_operator.stop()
        op.stop()
    text = op.log.read_text(errors="replace")
    assert "forbidden" not in text.lower(), f"the operator hit RBAC denials:\n{op.proc.log_tail(80)}"


def _chart_pod(cluster: Cluster, system_ns: str, deploy: str) -> None:
    """The chart's operator pod ran on the node meanwhile but cannot reach the API server (see the
    docstring): say how it fares, then scale it to 0 (the host process is the operator)."""
    found = pods(cluster, system_ns, "app.kubernetes.io/name=glasspipe-operator")
    assert found, "helm install made no operator pod"
    statuses = found[0].get("status", {}).get("containerStatuses") or [{}]
    logs = cluster.kubectl("logs", found[0]["metadata"]["name"], "-n", system_ns, "--tail=3", check=False).stdout
    print(f"[real-cluster] the chart's operator pod: image {found[0]['spec']['containers'][0]['image']}, restarts "
          f"{statuses[0].get('restartCount')}, state {json.dumps(statuses[0].get('state'))}; log tail:\n{logs.strip()}")
    cluster.kubectl("scale", f"deployment/{deploy}", "-n", system_ns, "--replicas=0")


def _scenario(tmp_path: Path, cluster: Cluster, op: Operator, so: SparkOperator, kafka: KafkaServer,
              ch: ClickHouseServer, ns: str, image: str, clock: Clock, rng: random.Random,
              chart_pod: Callable[[], None]) -> None:
    history = History(cluster, ns)
    try:
        _steps(tmp_path, cluster, op, so, kafka, ch, ns, image, clock, rng, history, chart_pod)
    finally:
        history.stop()


def _steps(tmp_path: Path, cluster: Cluster, op: Operator, so: SparkOperator, kafka: KafkaServer,
           ch: ClickHouseServer, ns: str, image: str, clock: Clock, rng: random.Random, history: History,
           chart_pod: Callable[[], None]) -> None:
    suffix = uuid.uuid4().hex[:8]
    topic, table = f"rc-sms-{suffix}", f"rc_sms_{suffix}"
    kafka.create_topic(topic, 4)
    kafka.create_topic(f"{topic}-dlq", 1)
    figures: dict[str, float] = {"cluster cold start": cluster.startup_seconds}

    def figure(name: str, since: float) -> None:
        figures[name] = time.monotonic() - since
        print(f"[real-cluster] {name}: {figures[name]:.1f} s (load average {os.getloadavg()[0]:.1f})", flush=True)

    def debug() -> str:
        listing = cluster.kubectl("get", "pods,sparkapplications", "-n", ns, "-o", "wide", check=False).stdout
        drivers = "".join(
            f"--- {p['metadata']['name']} ---\n"
            + cluster.kubectl("logs", p["metadata"]["name"], "-n", ns, "--tail=25", check=False).stdout
            for p in pods(cluster, ns, "spark-role=driver"))
        return (f"{listing}\n{drivers}\nstates and driver pods (kubectl get -w):\n{history.text()}\n"
                f"spark-operator:\n{so.logs()}\noperator:\n{op.proc.log_tail(40)}\nfigures so far: {figures}")

    def wait_ready(what: str, timeout: float = APP_TIMEOUT) -> None:
        try:
            def ready() -> dict[str, Any] | None:
                stale_image(op.condition(ns, NAME, "Degraded"))
                return condition_is(op, ns, "Ready", "True", "AllReplicasRunning")
            wait_for(ready, f"{what}", timeout, op, interval=2.0)
        except BaseException:
            print(debug())
            raise
        clock.mark(what)

    def wait_rows(rows: int) -> None:
        def check() -> bool:
            stale_image(op.condition(ns, NAME, "Degraded"))
            n = count(ch, table)
            assert n >= rows, f"{n} of {rows} rows"
            return True
        try:
            wait_for(check, f"{rows} rows in {table}", APP_TIMEOUT, interval=2.0)
        except BaseException:
            print(debug())
            raise
        time.sleep(5)  # a late duplicate would land within a batch or two
        for driver_pod in pods(cluster, ns, "spark-role=driver"):  # where a driver's start-up time went
            name = driver_pod["metadata"]["name"]
            text = cluster.kubectl("logs", name, "-n", ns, "--timestamps", check=False).stdout
            path = tmp_path / f"{name}-{rows}.log"
            path.write_text(text)
            lines = text.splitlines()
            print(f"[real-cluster] {name}: {len(lines)} log lines in {path}; first and last:\n"
                  + "\n".join(x[:200] for x in lines[:1] + lines[-3:]), flush=True)
            # the driver pod (spark.properties alone in its conf folder) maps the image's CDS archive
            assert "glasspipe: the driver JVM maps the class-data-sharing archive" in text, text[:3000]

    # ---- (1) kubectl apply of the sms-dedup example, pointed at the node's Kafka and ClickHouse
    doc = load_example("sms-dedup.yaml")
    doc["metadata"] = {"name": NAME, "namespace": ns}
    spec: dict[str, Any] = doc["spec"]
    spec["sources"][0]["kafka"].update(bootstrapServers=kafka.bootstrap, topic=topic)
    spec["sink"]["clickhouse"].update(hosts=[f"{ch.host}:{ch.port}"], table=table)
    spec["deadLetter"]["topic"] = f"{topic}-dlq"
    # Inside the driver pod: a new driver pod starts a new checkpoint from ClickHouse's ledger (and re-reads
    # the dedup window as warm-up), which is the path a lost checkpoint takes (docs/exactly-once.md).
    spec["checkpoint"]["location"] = f"file:///tmp/glasspipe-checkpoints/{NAME}"
    spec["spark"] = {**SPARK_SETTINGS, "image": image, "imagePullPolicy": "Never"}
    records, firsts1 = batch("a", 2000, timedelta(0), 500, [], timedelta(0), rng)
    produce(kafka.bootstrap, topic, records)
    t_apply = time.monotonic()
    op.k("apply", "-f", str(write_pipeline(doc, tmp_path)))
    clock.mark(f"kubectl apply {NAME}; produced {len(records)} events, 2000 keys")
    wait_ready("GlassPipeline Ready=True (1 replica)")
    ready_s = time.monotonic() - t_apply
    apps = op.apps(ns)
    driver = apps[f"{NAME}-0"]["status"]["driverInfo"]["podName"]
    pod = json.loads(cluster.kubectl("get", "pod", driver, "-n", ns, "-o", "json").stdout)
    assert pod["spec"]["containers"][0]["image"] == image and pod["status"]["phase"] == "Running", pod["status"]
    assert pod["spec"]["serviceAccountName"] == "spark-operator-spark"
    assert pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "250m"
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env") or []}
    assert env.get("PYSPARK_PYTHON") == env.get("PYSPARK_DRIVER_PYTHON") == IMAGE_PYTHON, env
    # The job's own Spark settings (contract.REQUIRED_SPARK_CONF) reach the driver through spark-operator: the
    # default Java options on the JVM's command line ahead of the spec's extraJavaOptions, the rest in its properties.
    jvm = driver_jvm_arguments(cluster, ns, driver)
    assert jvm.index(G1_REGION_OPTION) < jvm.index("-XX:+UseSerialGC"), jvm
    properties = cluster.kubectl("exec", driver, "-n", ns, "--", "cat", "/opt/spark/conf/spark.properties").stdout
    assert "spark.task.maxDirectResultSize=64m" in properties.splitlines(), properties
    figure("kubectl apply -> Ready", t_apply)
    wait_rows(2000)
    figure("kubectl apply -> 2000 exact rows", t_apply)
    assert_exact(ch, table, 2000)
    clock.mark(f"(1) 2000 rows, one per sms_id ({ready_s:.1f} s from kubectl apply to Ready)")
    chart_pod()

    # ---- (2) kubectl scale to 2 and back to 1
    t_scale = time.monotonic()
    op.k("scale", f"{GP}/{NAME}", "-n", ns, "--replicas=2")
    wait_for(lambda: sorted(app_states(op, ns)) == [f"{NAME}-0", f"{NAME}-1"] or None, "two applications",
             APP_TIMEOUT, op, interval=2.0)
    wait_ready("scaled to 2: GlassPipeline Ready=True")
    figure("scale 2 -> Ready", t_scale)
    for i in (0, 1):
        config = json.loads(op.apps(ns)[f"{NAME}-{i}"]["spec"]["arguments"][1])
        assert (config["replica"], config["replicas"]) == (i, 2)
    assert len([p for p in pods(cluster, ns, "spark-role=driver") if p["status"]["phase"] == "Running"]) == 2
    records, firsts2 = batch("b", 1000, timedelta(seconds=60), 300, firsts1, timedelta(seconds=100), rng)
    produce(kafka.bootstrap, topic, records)
    wait_rows(3000)
    figure("scale 2 -> 3000 exact rows", t_scale)
    assert_exact(ch, table, 3000)
    clock.mark("(2) 3000 rows, one per sms_id, with 2 replicas")

    # ---- (3) delete a driver pod mid-stream: Degraded, then Ready again, rows exact
    victim = op.apps(ns)[f"{NAME}-1"]["status"]["driverInfo"]["podName"]
    records, firsts3 = batch("c", 500, timedelta(seconds=150), 200, firsts1 + firsts2, timedelta(seconds=170), rng)
    produce(kafka.bootstrap, topic, records[: len(records) // 2])
    t_delete = time.monotonic()
    cluster.kubectl("delete", "pod", victim, "-n", ns, "--wait=false")
    clock.mark(f"kubectl delete pod {victim}")
    produce(kafka.bootstrap, topic, records[len(records) // 2:])

    def degraded_now() -> dict[str, Any] | None:
        c = op.condition(ns, NAME, "Degraded")
        return c if c.get("status") == "True" else None
    try:
        degraded = wait_for(degraded_now, "Degraded=True", 300, op, interval=1.0)
    except BaseException:
        print(debug())
        raise
    figure("delete pod -> Degraded", t_delete)
    clock.mark(f"GlassPipeline Degraded=True {degraded['reason']}: {degraded['message'].splitlines()[0]}")
    assert degraded["reason"] in ("ReplicaFailed", "ReplicaRestarting"), degraded
    assert f"replica {NAME}-1 " in degraded["message"], degraded
    wait_ready("GlassPipeline Ready=True again after the driver pod's deletion")
    figure("delete pod -> Ready", t_delete)
    print(f"[real-cluster] after kubectl delete pod {victim}:\n{history.since(t_delete)}", flush=True)
    assert app_states(op, ns)[f"{NAME}-1"][1] >= 2, app_states(op, ns)
    assert op.condition(ns, NAME, "Degraded")["status"] == "False"

    def warned() -> bool:  # kopf posts events from a queue: shortly after the status
        events = json.loads(op.k("get", "events", "-n", ns, "-o", "json"))["items"]
        return any(e["type"] == "Warning" and e["reason"] in ("ReplicaFailed", "ReplicaRestarting") for e in events)
    wait_for(warned, "a Warning event ReplicaFailed or ReplicaRestarting", 60, op, interval=1.0)
    wait_rows(3500)
    figure("delete pod -> 3500 exact rows", t_delete)
    assert_exact(ch, table, 3500)
    clock.mark("(3) 3500 rows, one per sms_id, across the deleted driver pod")

    t_scale = time.monotonic()
    op.k("scale", f"{GP}/{NAME}", "-n", ns, "--replicas=1")
    wait_for(lambda: sorted(app_states(op, ns)) == [f"{NAME}-0"] or None, "one application", APP_TIMEOUT, op,
             interval=2.0)
    wait_ready("scaled back to 1: GlassPipeline Ready=True")
    figure("scale 1 -> Ready", t_scale)
    records, _ = batch("d", 300, timedelta(seconds=200), 100, firsts2 + firsts3, timedelta(seconds=210), rng)
    produce(kafka.bootstrap, topic, records)
    wait_rows(3800)
    figure("scale 1 -> 3800 exact rows", t_scale)
    assert_exact(ch, table, 3800)
    clock.mark("(4) 3800 rows, one per sms_id, back on 1 replica")

    # ---- (5) delete the pipeline: the garbage collector removes the applications, spark-operator the pods
    t_gc = time.monotonic()
    op.k("delete", f"{GP}/{NAME}", "-n", ns, "--wait=false")

    def all_gone() -> bool:
        left_apps = op.apps(ns)
        left_pods = pods(cluster, ns, f"glasspipe.io/pipeline={NAME}")
        assert not left_apps and not left_pods, (sorted(left_apps), [p["metadata"]["name"] for p in left_pods])
        return True
    wait_for(all_gone, "every SparkApplication and driver pod gone", 180, op, interval=1.0)
    figure("kubectl delete -> every child gone (garbage collector)", t_gc)
    clock.mark("(5) pipeline deleted: no SparkApplication, no driver pod left")
    assert count(ch, table) == 3800
    print("[real-cluster] figures: " + "; ".join(f"{k} {v:.1f} s" for k, v in figures.items()), flush=True)
