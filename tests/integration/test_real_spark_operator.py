"""The real Kubeflow spark-operator (built from its Go module) on the real node: a SparkApplication
with the project's Spark image is submitted by spark-operator's spark-submit, its driver pod runs on
the kubelet, and spark-operator reports the application RUNNING, then COMPLETED.

The job runs Spark in local mode inside the driver pod (``master("local[1]")`` in the script): the
node has no cluster DNS, so executors could not resolve the driver's Service name; one driver core
also suits the 2-core CI machine.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fixtures_cluster import import_project_image
from glasspipe_dev.cluster import NODE_NAME, Cluster
from glasspipe_dev.spark_operator import SparkOperator

pytestmark = pytest.mark.integration

SPARK_IMAGE_ARCHIVE = "glasspipe-spark"
PI = """\
import sys
from pyspark.sql import SparkSession

spark = SparkSession.builder.master("local[1]").appName("pi").getOrCreate()
n = int(sys.argv[1])
inside = spark.sparkContext.parallelize(range(n), 2).filter(
    lambda i: ((i * 7919) % 10007 / 10007.0) ** 2 + ((i * 104729) % 10009 / 10009.0) ** 2 <= 1.0
).count()
print(f"PI_ROWS={n} PI_INSIDE={inside} PI={4.0 * inside / n:.3f}", flush=True)
spark.stop()
"""


@pytest.fixture(scope="module")
def namespace(cluster: Cluster) -> str:
    ns = f"so-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", ns)
    return ns


@pytest.fixture(scope="module")
def spark_operator(cluster: Cluster, namespace: str) -> Iterator[SparkOperator]:
    op = SparkOperator(cluster, [namespace]).start()
    try:
        yield op
    finally:
        op.stop()


def _app(namespace: str, image: str) -> dict[str, Any]:
    template = {
        "spec": {
            "containers": [
                {"name": "spark-kubernetes-driver", "volumeMounts": [{"name": "job", "mountPath": "/opt/pi"}]}
            ],
            "volumes": [{"name": "job", "configMap": {"name": "pi"}}],
        }
    }
    return {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {"name": "pi", "namespace": namespace},
        "spec": {
            "type": "Python",
            "pythonVersion": "3",
            "mode": "cluster",
            "image": image,
            "imagePullPolicy": "Never",
            "mainApplicationFile": "local:///opt/pi/pi.py",
            "arguments": ["20000"],
            "sparkVersion": "4.2.0",
            "sparkConf": {"spark.kubernetes.driver.podTemplateContainerName": "spark-kubernetes-driver"},
            "restartPolicy": {"type": "Never"},
            "driver": {"cores": 1, "memory": "512m", "serviceAccount": "default", "template": template},
            "executor": {"instances": 1, "cores": 1, "memory": "512m"},
        },
    }


def test_spark_application_runs_to_completed(
    cluster: Cluster, namespace: str, spark_operator: SparkOperator
) -> None:
    image = import_project_image(cluster, SPARK_IMAGE_ARCHIVE)
    cluster.kubectl("create", "configmap", "pi", "-n", namespace, "--from-literal", f"pi.py={PI}")
    t0 = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=json.dumps(_app(namespace, image)))
    seen: list[str] = []
    deadline = time.monotonic() + 420
    state = ""
    while time.monotonic() < deadline:
        app = json.loads(cluster.kubectl("get", "sparkapplication", "pi", "-n", namespace, "-o", "json").stdout)
        state = app.get("status", {}).get("applicationState", {}).get("state", "")
        if state and (not seen or seen[-1] != state):
            seen.append(state)
            print(f"\n[spark-operator] {time.monotonic() - t0:6.1f} s  {state}")
        if state in ("COMPLETED", "FAILED", "SUBMISSION_FAILED"):
            break
        time.sleep(1)
    assert state == "COMPLETED", f"states {seen}\n{spark_operator.logs()}\n{app.get('status')}"
    assert "RUNNING" in seen, seen
    driver = app["status"]["driverInfo"]["podName"]
    pod = json.loads(cluster.kubectl("get", "pod", driver, "-n", namespace, "-o", "json").stdout)
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["metadata"]["labels"]["spark-role"] == "driver"
    assert pod["spec"]["containers"][0]["image"] == image
    logs = cluster.kubectl("logs", driver, "-n", namespace).stdout
    assert "PI_ROWS=20000" in logs, logs[-3000:]
    print(f"\n[spark-operator] apply -> COMPLETED in {time.monotonic() - t0:.1f} s; states {seen}")
