"""Fixtures that start real servers, shared by all tests (each starts on first use, once per run)."""

import os
from collections.abc import Generator
from typing import Any

import pytest
from pluggy import Result

from glasspipe_dev.spark_cds import test_spark_submit_opts

# Every Spark driver the tests start (the shared session, each `glasspipe run`, the stand-in's
# drivers) maps the classes from the CDS archive and skips C2: a restart costs about half.
os.environ.setdefault("SPARK_SUBMIT_OPTS", test_spark_submit_opts())

# session fixtures whose log a failed test's report carries
SESSION_SERVERS = ("kafka", "clickhouse", "secure_kafka", "secure_clickhouse")

pytest_plugins = ["fixtures_kafka", "fixtures_clickhouse", "fixtures_kube", "fixtures_jvm_ops", "fixtures_images",
                  "fixtures_security", "fixtures_cluster"]



def _on_node(item: pytest.Item) -> bool:
    marker = item.get_closest_marker("xdist_group")
    return marker is not None and marker.args[:1] == ("node",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The node cluster's tests first (stable otherwise): with two workers, the one that owns the
    cluster starts it at once instead of leaving its ~6 minutes as the run's tail."""
    items.sort(key=lambda item: not _on_node(item))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Result[Any], None]:
    """A failed test's report carries the machine's load and the log tail of each session server it used: a CI
    failure such as "Broker transport failure" then shows what the broker was doing, not only what a client saw."""
    report: pytest.TestReport = (yield).get_result()
    if not report.failed:
        return
    used = getattr(item, "funcargs", {})
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    for name in SESSION_SERVERS:
        server = used.get(name)
        if server is not None:
            state = "running" if server.running() else "NOT running"
            report.sections.append((f"{name} ({state}; load average {load}): the end of its log",
                                    server.log_tail(60)))
