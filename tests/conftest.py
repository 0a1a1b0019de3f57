"""Fixtures that start real servers, shared by all tests (each starts on first use, once per run)."""

import os

import pytest

from glasspipe_dev.spark_cds import test_spark_submit_opts

# Every Spark driver the tests start (the shared session, each `glasspipe run`, the stand-in's
# drivers) maps the classes from the CDS archive and skips C2: a restart costs about half.
os.environ.setdefault("SPARK_SUBMIT_OPTS", test_spark_submit_opts())

pytest_plugins = ["fixtures_kafka", "fixtures_clickhouse", "fixtures_kube", "fixtures_jvm_ops", "fixtures_images",
                  "fixtures_security", "fixtures_cluster"]



def _on_node(item: pytest.Item) -> bool:
    marker = item.get_closest_marker("xdist_group")
    return marker is not None and marker.args[:1] == ("node",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The node cluster's tests first (stable otherwise): with two workers, the one that owns the
    cluster starts it at once instead of leaving its ~6 minutes as the run's tail."""
    items.sort(key=lambda item: not _on_node(item))
