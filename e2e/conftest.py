"""End-to-end fixtures: real servers (from tests/fixtures_*), the operator and the spark-operator stand-in.

`tests/` is on pytest's pythonpath (pyproject), so the same session fixtures serve both folders; pytest
registers each plugin module once even when both conftests name it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from glasspipe_dev.kube import KubeAPIServer
from operator_harness import Operator, running_operator
from spark_operator_standin import StandInProcess

pytest_plugins = ["fixtures_kafka", "fixtures_clickhouse", "fixtures_kube", "fixtures_jvm_ops"]


@pytest.fixture(scope="module")
def glasspipe_operator(kube: KubeAPIServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operator]:
    """The operator under the chart's RBAC (CRDs applied), as in tests/integration/test_operator.py."""
    with running_operator(kube, tmp_path_factory.mktemp("operator") / "operator.log") as op:
        yield op


@pytest.fixture(scope="module")
def spark_operator(kube: KubeAPIServer, glasspipe_operator: Operator, jvm_ops_jar: str, spark_jars: list[str],
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInProcess]:
    """The spark-operator stand-in (once the CRDs exist): runs every SparkApplication as a local Spark job."""
    standin = StandInProcess(kube.kubeconfig, tmp_path_factory.mktemp("standin"), "--running-after=3",
                             "--kill-grace=10")
    standin.start()
    try:
        yield standin
    finally:
        standin.stop()
