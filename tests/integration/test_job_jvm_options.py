"""The job's Java options reach the JVM that Spark starts: ``contract.REQUIRED_SPARK_CONF`` sets them as Spark's
*default* Java options (16 MB G1 regions, so that a batch's multi-MB task results are not humongous), and only Spark's
launcher turns that setting into JVM arguments. The test session is started with the job's settings, as the job's own
session is (``glasspipe_job.session``), so a launcher that ignored the setting would show here."""

from __future__ import annotations

from typing import Any

import pytest

from glasspipe.contract import DRIVER_DEFAULT_JAVA_OPTIONS_CONF, G1_REGION_OPTION, REQUIRED_SPARK_CONF

pytestmark = pytest.mark.integration


def test_the_driver_jvm_runs_with_the_jobs_default_java_options(spark: Any) -> None:
    assert REQUIRED_SPARK_CONF[DRIVER_DEFAULT_JAVA_OPTIONS_CONF] == G1_REGION_OPTION
    jvm = spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert G1_REGION_OPTION in arguments, arguments
    # the extra options the test session sets (derby's home) are there too: the default ones add, not replace
    assert any(a.startswith("-Dderby.system.home=") for a in arguments), arguments
    diagnostic = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    assert diagnostic.getVMOption("G1HeapRegionSize").getValue() == str(16 * 1024 * 1024)
