"""End-to-end fixtures: real servers (from tests/fixtures_*), the operator and the spark-operator stand-in.

`tests/` is on pytest's pythonpath (pyproject), so the same session fixtures serve both folders; pytest
registers each plugin module once even when both conftests name it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from glasspipe_dev.kube import KubeAPIServer
from operator_harness import Operator, running_operator
from spark_operator_standin import StandInProcess

pytest_plugins = ["fixtures_kafka", "fixtures_clickhouse", "fixtures_kube", "fixtures_jvm_ops", "fixtures_cluster"]


@pytest.fixture(scope="module")
def glasspipe_operator(kube: KubeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """The operator under the chart's RBAC (CRDs applied), as in tests/integration/test_operator.py."""
    with running_operator(kube, tmp_path_factory.mktemp("operator") / "operator.log") as op:
        yield op


@pytest.fixture(scope="module")
def e2e_namespace(kube: KubeAPIServer) -> str:
    """The namespace of the full-path tests: the stand-in runs only its SparkApplications, so pipelines
    that other test modules left in the API server (pointing at hosts that do not exist here) never
    become local Spark jobs."""
    ns = f"e2e-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", ns)
    return ns


@pytest.fixture(scope="module")
def spark_operator(kube: KubeAPIServer, glasspipe_operator: Operator, jvm_ops_jar: str, spark_jars: list[str],
                   e2e_namespace: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInProcess]:
    """The spark-operator stand-in (once the CRDs exist): runs the e2e namespace's SparkApplications as
    local Spark jobs."""
    standin = StandInProcess(kube.kubeconfig, tmp_path_factory.mktemp("standin"), "--running-after=3",
                             "--kill-grace=10", "--submit-seconds=3", "-n", e2e_namespace)
    standin.start()
    try:
        yield standin
    finally:
        standin.stop()
