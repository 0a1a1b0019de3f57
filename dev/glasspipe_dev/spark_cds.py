"""A class-data-sharing archive (AppCDS) of the classes a glasspipe Spark driver loads, and the JVM
options the tests start Spark with.

Every local Spark start (each `glasspipe run`, each SIGKILL-and-restart in the tests) loads and
verifies about 20,000 classes before its first batch. A dynamic CDS archive, dumped once at set-up
by a real run of the sms-dedup pipeline against a local Kafka and ClickHouse, lets later JVMs map
them instead (measured: a 1-record `--available-now` run 26.6 s -> 18.3 s, an empty one 15.1 s ->
8.0 s, with the test options below). The archive is keyed by the JVM, pyspark and every jar on
the classpath, so a changed jar gets a new archive; a JVM that finds a mismatching archive runs
without it (-Xshare:auto), never fails.

The same run also writes the list of classes it loaded (``-XX:DumpLoadedClassList``, names only, no
paths): the Spark image's build dumps its own archive from it against the image's classpath
(sparkapp/Dockerfile, dev/install/images.sh), so a driver pod maps those classes too.

Run ``python -m glasspipe_dev.spark_cds`` (dev/install/spark-cds.sh) to make them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from glasspipe_dev.paths import cache_dir, java_binary
from glasspipe_dev.spark import pyspark_version, spark_jars

# Short-lived test JVMs spend more CPU compiling with C2 than they gain from it, and the parallel
# collectors' threads compete with Kafka and ClickHouse on two cores. Tests only; the job itself
# keeps the JVM's defaults.
TEST_JIT_AND_GC = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


def _jvm_ops_jar() -> str:
    from glasspipe_job.jvm import jvm_ops_jar

    return jvm_ops_jar()


def archive_path() -> Path:
    """Where the archive for this JVM, pyspark and these jars lives (it may not exist yet)."""
    java = java_binary().resolve()
    digest = hashlib.sha256(f"{java}\0{java.stat().st_size}\0{pyspark_version()}\0".encode())
    for jar in (*spark_jars(), _jvm_ops_jar()):
        stat = Path(jar).stat()
        digest.update(f"{jar}:{stat.st_size}:{stat.st_mtime_ns}\0".encode())
    return cache_dir() / "spark-cds" / f"driver-{digest.hexdigest()[:16]}.jsa"


def class_list_path() -> Path:
    """The class list written by the run that dumped the archive (next to it, same key)."""
    return archive_path().with_suffix(".classlist")


def test_spark_submit_opts() -> str:
    """SPARK_SUBMIT_OPTS for the tests' Spark drivers: C1 only, serial GC, and the archive if made."""
    options = list(TEST_JIT_AND_GC)
    try:
        archive = archive_path()
    except (OSError, RuntimeError):  # not installed yet: the fixtures say what to install
        archive = None
    if archive is not None and archive.is_file():
        options.append(f"-XX:SharedArchiveFile={archive}")
    return " ".join(options)


def dump_archive() -> Path:
    """Run the sms-dedup example once with -XX:ArchiveClassesAtExit and -XX:DumpLoadedClassList; a no-op if
    the archive and the class list exist."""
    from glasspipe_dev.clickhouse import ClickHouseServer
    from glasspipe_dev.kafka import KafkaServer
    from glasspipe_dev.pipelines import dumps, produce, run_to_end, sms_dedup_pipeline

    target, class_list = archive_path(), class_list_path()
    if target.is_file() and class_list.is_file():
        print(f"spark CDS archive: cached ({target})")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.partial")
    partial_list = class_list.with_suffix(f".{os.getpid()}.partial-list")
    with tempfile.TemporaryDirectory(prefix="gp-cds-") as scratch:
        work = Path(scratch)
        with KafkaServer(work / "kafka").start() as kafka, ClickHouseServer(work / "clickhouse").start() as ch:
            kafka.create_topic("cds", 2)
            kafka.create_topic("cds-dlq", 1)
            at = datetime.now(UTC).isoformat()
            produce(kafka.bootstrap, "cds", [
                (f"k{i % 7}".encode(), dumps({"sms_id": f"k{i % 7}", "status": "s", "phone": "+1", "meta": {},
                                              "sent_at": at}))
                for i in range(20)
            ] + [(b"bad", b"not json")])
            pipeline = sms_dedup_pipeline(work, "cds", "cds", max_rows=1000)
            os.environ["SPARK_SUBMIT_OPTS"] = (f"-XX:ArchiveClassesAtExit={partial} "
                                               f"-XX:DumpLoadedClassList={partial_list}")
            run_to_end(pipeline, kafka.bootstrap, f"127.0.0.1:{ch.port}", work / "checkpoint")
    for made in (partial, partial_list):
        if not made.is_file():
            raise RuntimeError(f"the Spark driver exited without writing {made}")
    partial.replace(target)
    partial_list.replace(class_list)
    for old in (*target.parent.glob("driver-*.jsa"), *target.parent.glob("driver-*.classlist")):
        if old not in (target, class_list):
            old.unlink()
    print(f"spark CDS archive: {target} ({target.stat().st_size >> 20} MiB)")
    return target


if __name__ == "__main__":
    if sys.argv[1:] == ["--class-list"]:  # dev/install/images.sh: where the list is (made already)
        print(class_list_path())
        sys.exit(0)
    try:
        dump_archive()
    except (OSError, RuntimeError, subprocess.SubprocessError) as err:
        print(f"ERROR: could not make the Spark CDS archive: {err}", file=sys.stderr)
        sys.exit(1)
