"""``glasspipe run`` with bench/PartitionDedupProbe.java in place of the job's deduplication operator (a probe).

Compiles the probe against pyspark's jars (cached by its source's hash), adds it to the session's jars and puts
its ``deduplicate`` where ``glasspipe_job.jvm.deduplicate_within_window`` calls ``WindowDedup.deduplicate``,
keeps each Kafka partition's range of a batch in one Spark partition (the probe needs a partition's records in
offset order, in one task); then runs the CLI with this script's arguments. For bench/freshness.py ``--variant
partition-probe``: what deduplication costs with its state per Kafka partition, laid out by time, in the first
stage. Not exactly-once (see the Java class; the job's ``deduplication.perKafkaPartition`` is the same layout in
Spark's state store, which is), so never a pipeline's engine; single-source pipelines only.

    python bench/partition_probe_run.py run PIPELINE.yaml --bootstrap-servers ... --clickhouse ... --checkpoint ...
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyspark

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "dev"))  # the job itself from where `glasspipe run` finds it (PYTHONPATH, --code)

from glasspipe_dev.paths import java_binary  # noqa: E402

PROBE = Path(__file__).resolve().with_name("PartitionDedupProbe.java")
ENTRY = "io.glasspipe.bench.PartitionDedupProbe"


def probe_jar(ops_jar: str) -> Path:
    """The probe compiled against pyspark's jars and the job's operators jar (it reads event times and flags rows
    with ``FirstOccurrence``'s code), into $GLASSPIPE_CACHE/partition-probe/<hash>/probe.jar: once per source and
    operators jar (whose path holds the hash of its sources)."""
    digest = hashlib.sha256(PROBE.read_bytes() + pyspark.__version__.encode() + ops_jar.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("GLASSPIPE_CACHE", Path.home() / ".cache" / "glasspipe"))
    jar = cache / "partition-probe" / digest / "probe.jar"
    if jar.is_file():
        return jar
    bin_dir = Path(java_binary()).parent
    jars = Path(pyspark.__file__).parent / "jars"
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([str(bin_dir / "javac"), "--release", "17", "-encoding", "UTF-8", "-cp", f"{jars}/*:{ops_jar}",
                        "-d", f"{tmp}/classes", str(PROBE)], check=True)
        jar.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(bin_dir / "jar"), "--create", "--file", f"{tmp}/probe.jar", "-C", f"{tmp}/classes", "."],
                       check=True)
        os.replace(f"{tmp}/probe.jar", jar)
    return jar


def main() -> int:
    import glasspipe.api.models as models
    import glasspipe_job.jvm as jvm

    ops_jar = jvm.jvm_ops_jar()
    with_probe = f"{ops_jar},{probe_jar(ops_jar)}"

    def probe_deduplicate(df: Any, keys: list[str], event_time_col: str, window_seconds: float,
                          flag_col: str | None = None, passthrough_col: str | None = None,
                          partition_col: str | None = None, offset_col: str | None = None,
                          late_col: str | None = None, warmup_col: str | None = None,
                          judged_late: Any = None) -> Any:
        # warmup_col, judged_late: the probe flags no row late, a warm-up row included
        return jvm._call_static(df, ENTRY, "deduplicate", list(keys), event_time_col, round(window_seconds * 1000),
                                flag_col, passthrough_col, partition_col, offset_col, late_col)

    jvm.jvm_ops_jar = lambda: with_probe
    jvm.deduplicate_within_window = probe_deduplicate
    # One task per Kafka partition and batch: the job splits a large batch's Kafka ranges into several Spark
    # partitions (maxRecordsPerPartition, so that a part reaches the driver in bounded memory), whose tasks may run
    # at once and out of offset order, and a later record of a key would then win over its first occurrence.
    models.records_per_partition = lambda max_offsets_per_trigger: max_offsets_per_trigger
    from glasspipe.cli import main as cli

    return int(cli(sys.argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
