"""Freshness in the GlassPipeline status, end to end on the real kube-apiserver and a real metrics endpoint.

The operator runs as `glasspipe-operator` under the chart's RBAC. The test plays spark-operator and the
kubelet: it creates the driver Pod of a RUNNING application, declares the metrics port on its container
as the render does, and writes the pod's status (phase Running, podIP 127.0.0.1) through the status
subresource. Behind that address runs the job's own metrics (glasspipe_job.metrics.JobMetrics, served by
prometheus_client's server as the driver does), fed commits with known event times; no Spark.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import yaml
from prometheus_client import CollectorRegistry, start_http_server

from glasspipe import contract
from glasspipe.render import metrics_port
from glasspipe_dev.kube import KubeAPIServer
from glasspipe_dev.process import free_port
from glasspipe_job.metrics import JobMetrics
from operator_harness import ROOT, Operator, driver_pod_manifest, running_operator, wait_for

pytestmark = pytest.mark.integration

FRESHNESS_INTERVAL = 2.0


@pytest.fixture(scope="module")
def operator(kube: KubeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with running_operator(kube, log, extra_args=[f"--freshness-interval={FRESHNESS_INTERVAL}"]) as op:
        yield op


def create_pipeline(op: Operator, ns: str, name: str = "pay") -> None:
    doc = yaml.safe_load((ROOT / "examples" / "filter-mapping.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": ns}
    doc["spec"]["replicas"] = 1
    op.k("apply", "-f", "-", input=json.dumps(doc))


def running_driver(op: Operator, ns: str, app: dict[str, Any], port: int) -> str:
    """The driver pod spark-operator and the kubelet would make: the app's labels, owned by it, the metrics
    port declared by name (the rendered template's container, at the port the test's server listens on)."""
    name = f"{app['metadata']['name']}-driver"
    [rendered] = app["spec"]["driver"]["template"]["spec"]["containers"]
    assert rendered["ports"] == [metrics_port()]  # what the API server kept of the render
    pod = driver_pod_manifest(ns, app, {
        "name": rendered["name"],
        "ports": [{**metrics_port(), "containerPort": port}, {"name": "spark-ui", "containerPort": 4040}]})
    op.k("apply", "-f", "-", input=json.dumps(pod))
    status = {"status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}}
    op.k("patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge", "-p", json.dumps(status))
    return name


def commit(metrics: JobMetrics, committed_at: float, kafka_s: list[float], event_s: list[float]) -> None:
    metrics.observe_commit(committed_at, np.asarray([int(t * 1e6) for t in kafka_s], dtype=np.int64),
                           np.asarray([int(t * 1e6) for t in event_s], dtype=np.int64))


def freshness(op: Operator, ns: str) -> dict[str, Any]:
    [replica] = op.pipeline(ns, "pay")["status"]["replicaStatuses"]
    return dict(replica.get("freshness") or {})


def table_row_at_a_steady_lag(op: Operator, ns: str) -> tuple[str, str, float]:
    """`kubectl get`'s header and row with the status lag read just before and after it, once the two agree:
    the operator rewrites the lag every interval, so a single read may fall either side of an update."""
    for _ in range(10):
        before = op.pipeline(ns, "pay")["status"]["eventTimeLagSeconds"]
        header, row = op.k("get", "glasspipelines.glasspipe.io", "pay", "-n", ns).splitlines()[:2]
        if op.pipeline(ns, "pay")["status"]["eventTimeLagSeconds"] == before:
            return header, row, before
    raise AssertionError(f"the status lag changed during each of 10 reads of the table "
                         f"(interval {FRESHNESS_INTERVAL} s)")


def test_status_shows_each_replica_s_committed_event_time(operator: Operator) -> None:
    op, ns = operator, operator.new_namespace()
    create_pipeline(op, ns)
    app = op.wait_apps(ns, ["pay-0"])["pay-0"]
    op.set_state(ns, "pay-0", "RUNNING")
    op.wait_condition(ns, "pay", "Ready", "True")

    job = JobMetrics("pay", 0, registry=CollectorRegistry())
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=job.registry)
    try:
        now = time.time()
        newest = round(now - 7.25, 3)  # the newest committed event: 7.25 s before now
        commit(job, now, [now - 0.3] * 99 + [now - 4.0], [now - 60, newest, now - 30])
        pod = running_driver(op, ns, app, port)

        def shown() -> dict[str, Any] | None:
            f = freshness(op, ns)
            return f if "lastCommittedEventTime" in f else None

        first = wait_for(shown, "the replica's lastCommittedEventTime in status", timeout=30, operator=op)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(newest)) + f".{round(newest % 1 * 1000):03d}Z"
        assert first["lastCommittedEventTime"] == stamp
        assert first["driverPod"] == pod and "error" not in first
        assert 7.0 <= first["eventTimeLagSeconds"] <= 7.25 + 30, first  # observed within the wait
        assert 0.25 < first["endToEndLatencyP95Seconds"] <= 0.5, first  # 99 of 100 rows 0.3 s after append
        # The pipeline's lag is its replicas' largest; read both from one object, as the lag moves every interval.
        status = op.pipeline(ns, "pay")["status"]
        assert status["eventTimeLagSeconds"] == status["replicaStatuses"][0]["freshness"]["eventTimeLagSeconds"]
        # The per-replica jsonpath docs/operations.md gives.
        jsonpath = ('{range .status.replicaStatuses[*]}{.index} {.freshness.lastCommittedEventTime} '
                    'lag={.freshness.eventTimeLagSeconds} p95={.freshness.endToEndLatencyP95Seconds} '
                    '{.freshness.error}{"\\n"}{end}')
        assert jsonpath in (ROOT / "docs" / "operations.md").read_text()
        line = op.k("get", "glasspipelines.glasspipe.io", "pay", "-n", ns, "-o", f"jsonpath={jsonpath}")
        assert line.startswith(f"0 {stamp} lag="), line
        header, row, lag = table_row_at_a_steady_lag(op, ns)
        assert "LAG" in header.split() and str(lag) in row.split(), (header, row, lag)

        # The next observations follow new commits; the p95 is of the rows committed since the last one.
        later = time.time()
        commit(job, later, [later - 20.0] * 10, [later - 1.5])
        again = wait_for(lambda: (f := freshness(op, ns)).get("lastCommittedEventTime") != stamp and f,
                         "the new commit in status", timeout=30, operator=op)
        assert again["lastCommittedEventTime"] > stamp and again["eventTimeLagSeconds"] < 1.5 + 30
        assert 10 <= again["endToEndLatencyP95Seconds"] <= 30, again  # the 10 new rows only, 20 s each

        # The driver's endpoint goes away: the entry says why, and the pipeline has no lag figure to show.
        server.shutdown()
        server.server_close()
        gone = wait_for(lambda: (f := freshness(op, ns)).get("error") and f, "the read error in status",
                        timeout=30, operator=op)
        assert gone["error"].startswith(f"could not read http://127.0.0.1:{port}{contract.JOB_METRICS_PATH}: "), gone
        assert gone["driverPod"] == pod and "lastCommittedEventTime" not in gone
        assert "eventTimeLagSeconds" not in op.pipeline(ns, "pay")["status"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
