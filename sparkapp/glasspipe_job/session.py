"""The job's SparkSession: one builder for spark-submit (the master comes from it), local runs and tests."""

from __future__ import annotations

import glob
import os
import shlex
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from glasspipe.contract import DRIVER_DEFAULT_JAVA_OPTIONS_CONF


def spark_session(app_name: str, conf: Mapping[str, str], master: str | None = None,
                  quiet: bool = False) -> SparkSession:
    """getOrCreate with ``conf``; ``quiet`` sets Spark's log level to WARN (local runs)."""
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    if quiet:
        spark.sparkContext.setLogLevel("WARN")
    return spark


def driver_heap_bytes(spark: SparkSession) -> int:
    """The driver JVM's max heap (what spark.driver.memory gave it): what a micro-batch is bounded by."""
    return int(spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory())  # type: ignore[union-attr]


def connector_jars() -> list[str]:
    """The Kafka connector jars (GLASSPIPE_SPARK_JARS, else those dev/install/spark-jars.sh cached)."""
    import pyspark

    if os.environ.get("GLASSPIPE_SPARK_JARS"):
        return [j for j in os.environ["GLASSPIPE_SPARK_JARS"].split(",") if j]
    cache = Path(os.environ.get("GLASSPIPE_CACHE", Path.home() / ".cache" / "glasspipe"))
    jars = sorted(glob.glob(str(cache / "spark-jars" / pyspark.__version__ / "*.jar")))
    if not jars:
        raise FileNotFoundError(f"no Kafka connector jars for pyspark {pyspark.__version__} in {cache}/spark-jars: "
                                "run `bash dev/install/spark-jars.sh` or set GLASSPIPE_SPARK_JARS")
    return jars


def local_session(app_name: str, conf: Mapping[str, str]) -> SparkSession:
    """Local Spark (GLASSPIPE_SPARK_MASTER, default local[2]) with the Kafka connector and the JVM operators
    on the classpath: ``glasspipe run`` and ``main.py --local`` (the e2e spark-operator stand-in)."""
    from glasspipe_job.jvm import jvm_ops_jar

    local = {
        "spark.jars": ",".join([*connector_jars(), jvm_ops_jar()]),
        "spark.ui.enabled": "false",
        "spark.driver.memory": os.environ.get("GLASSPIPE_DRIVER_MEMORY", "2g"),
        "spark.sql.session.timeZone": "UTC",
    }
    spark = spark_session(app_name, with_temp_dir({**local, **conf}, tempfile.gettempdir()),
                          master=os.environ.get("GLASSPIPE_SPARK_MASTER", "local[2]"), quiet=True)
    leave_sigterm_to_python(spark)
    return spark


def leave_sigterm_to_python(spark: SparkSession) -> None:
    """A local driver JVM is the job's Python's child, in its process group: a SIGTERM to the group (systemd's stop,
    ``kill -- -PGID``, the test harness's) ran Spark's shutdown hook under the batch in flight, and the job died
    with "the driver's Spark JVM is gone". The JVM now ignores SIGTERM: the Python stops between micro-batches, and
    the JVM ends when the Python does (its stdin closes), as in the image (dev/images/spark-entrypoint.sh)."""
    jvm: Any = spark.sparkContext._jvm
    jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal("TERM"), jvm.sun.misc.SignalHandler.SIG_IGN)


def with_temp_dir(conf: Mapping[str, str], temp_dir: str) -> dict[str, str]:
    """``conf`` with the driver JVM's java.io.tmpdir at ``temp_dir`` (TMPDIR, else /tmp): Java ignores TMPDIR, and
    a local Spark keeps its scratch there (spark-*/ with the jars, the state stores' working copies, the block
    manager's files; the native libraries it unpacks), which a killed run leaves behind (34 MB each). The option
    joins the default Java options, which a user's extraJavaOptions add to."""
    options = conf.get(DRIVER_DEFAULT_JAVA_OPTIONS_CONF, "")
    return {**conf, DRIVER_DEFAULT_JAVA_OPTIONS_CONF: f"{options} -Djava.io.tmpdir={shlex.quote(temp_dir)}".strip()}
