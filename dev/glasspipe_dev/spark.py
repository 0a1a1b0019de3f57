"""A local Spark for tests: the Kafka connector jars from the cache and a small local[2] session
(built by the job's own builder, glasspipe_job.session.spark_session).

The connector (spark-sql-kafka-0-10_2.13 at exactly the installed pyspark version, plus what it needs
that the pyspark wheel lacks) is fetched from Maven Central by dev/install/spark-jars.sh and passed
with `spark.jars`: no Ivy resolution at run time, so tests never touch the network.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from glasspipe_dev.paths import NotInstalledError, cache_dir, java_binary
from glasspipe_dev.reaper import remove_folder, temp_dir_at_exit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

INSTALL_HINT = "run `bash dev/install/spark-jars.sh` (fetches spark-sql-kafka-0-10 from Maven Central with mvn)"


def pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def spark_jars_dir(version: str | None = None) -> Path:
    return cache_dir() / "spark-jars" / (version or pyspark_version())


def spark_jars(version: str | None = None) -> list[str]:
    """Absolute paths of the Kafka connector jars for the installed pyspark (for `spark.jars`)."""
    version = version or pyspark_version()
    folder = spark_jars_dir(version)
    connector = folder / f"spark-sql-kafka-0-10_2.13-{version}.jar"
    if not (folder / ".installed").is_file() or not connector.is_file():
        raise NotInstalledError(
            f"Spark Kafka connector jars for pyspark {version} not found in {folder}: {INSTALL_HINT}"
        )
    return sorted(str(p) for p in folder.glob("*.jar"))


def ensure_java_env() -> None:
    """Spark 4 needs Java 17; pyspark starts whatever `java` JAVA_HOME (else PATH) names."""
    os.environ["JAVA_HOME"] = str(java_binary().parents[1])
    # Executors' Python workers must be this interpreter (the venv), not whatever `python3` is on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Skips the hostname lookup and the "resolves to a loopback address" warning.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def local_spark_session(
    app_name: str,
    shuffle_partitions: int = 2,
    extra_conf: Mapping[str, str] | None = None,
    extra_jars: Sequence[str] | None = None,
    driver_memory: str = "1g",
) -> SparkSession:
    """A local[2] SparkSession with the Kafka connector on its classpath, sized for a shared 2-core box.

    Static settings (jars, memory) only apply when this call starts the JVM; if a session is already
    running without our jars we fail instead of silently returning a session that cannot read Kafka.
    """
    ensure_java_env()
    from pyspark.sql import SparkSession

    from glasspipe_job.session import spark_session, with_temp_dir

    jars = [*spark_jars(), *(str(Path(j).resolve()) for j in (extra_jars or ()))]
    scratch = temp_dir_at_exit("gp-spark-")  # should this process be killed (the JVM ends with it: its stdin closes)
    atexit.register(remove_folder, scratch)
    conf: dict[str, str] = {
        "spark.jars": ",".join(jars),
        "spark.driver.memory": driver_memory,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Stateful streaming keeps one state store per shuffle partition: the default 200 is far too
        # many for 2 cores (and the count is frozen into each checkpoint).
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.default.parallelism": "2",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.warehouse.dir": str(scratch / "warehouse"),
        "spark.local.dir": str(scratch / "local"),
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={scratch / 'derby'}",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        "spark.sql.streaming.numRecentProgressUpdates": "20",
        "spark.python.worker.reuse": "true",
    }
    conf.update(extra_conf or {})

    active = SparkSession.getActiveSession()
    if active is not None:
        have = set(filter(None, active.sparkContext.getConf().get("spark.jars", "").split(",")))
        missing = [j for j in jars if j not in have]
        if missing:
            raise RuntimeError(
                f"a SparkSession is already running without {missing}; stop it before local_spark_session()"
            )
    # java.io.tmpdir too: the native libraries RocksDB and LZ4 unpack (15 MB a JVM), which a killed JVM leaves.
    return spark_session(app_name, with_temp_dir(conf, str(scratch)), master="local[2]", quiet=True)
