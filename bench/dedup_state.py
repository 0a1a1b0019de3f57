"""Measures event-time dedup on local Spark: throughput and small-batch latency vs live keys in state.

Compares glasspipe's JVM transformWithState operator (``--impl jvm``) with Spark's
``dropDuplicatesWithinWatermark`` (``--impl dropdup``), both on the RocksDB state store with
changelog checkpointing. Input is a parquet file source read one file per micro-batch
(maxFilesPerTrigger=1) into a ``noop`` sink, so the figures are the dedup operator plus Spark's
micro-batch overhead, with no Kafka or ClickHouse.

    python bench/dedup_state.py --impl jvm --sizes 0,1000000,10000000
    python bench/dedup_state.py --impl dropdup --sizes 0,1000000
    python bench/dedup_state.py --impl jvm --sizes 0,1000000 --judged-late-ranges 115000
    python bench/dedup_state.py --impl jvm --sizes 10000000,40000000,80000000 --small 50000 --repeat-share 0.1 \
        --scattered-keys --job-conf

``--small 50000 --repeat-share 0.1`` is a second of the peer's load-test shape at 50 000/s (bench/freshness.py);
``--scattered-keys`` makes the keys random ids (a hash of the number, 16 hex digits) instead of ``key-<n>``, so
new keys land all over the state, as in ``freshness.py --scattered-keys``; ``--job-conf`` runs Spark with the
settings ``glasspipe run`` gives it (contract.spark_conf: a snapshot a minute at a 1 s trigger, and the rest), which
leave the state's row count untracked (it prints as n/a). ``--drop-page-cache`` (root only) empties the operating
system's page cache before each measured batch, so every block RocksDB's own cache misses is read from the disk: what
a batch costs when the state's files no longer fit in memory beside everything else.

``--judged-late-ranges N`` hands the operator N late ranges of a hand-over (handover.judged_late), two Kafka
partitions' worth, as a new writer carries them for its whole life: what they cost each batch. No row here is a
warm-up row, so none is judged by them.

Keys are strings ``key-<n>``; event time is base + n microseconds (all keys stay inside the window
and above the watermark, so nothing is evicted: the state only grows). Each small batch has new keys and
duplicates of keys already in state, half each unless ``--repeat-share`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sparkapp"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))

from arg_types import comma_separated, key_value
from pyspark.sql import DataFrame, SparkSession

from glasspipe import contract
from glasspipe.api import models
from glasspipe_dev.pipelines import load_example
from glasspipe_job.jvm import deduplicate_within_window, jvm_ops_jar

BASE_US = 1_700_000_000_000_000  # event time origin, microseconds since the epoch
WINDOW_S = 7 * 24 * 3600
LATENESS = "1 hour"


def session(partitions: int, with_jar: bool, confs: dict[str, str]) -> SparkSession:
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("glasspipe-bench-dedup")
        .config("spark.driver.memory", "6g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(partitions))
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    )
    for k, v in confs.items():
        builder = builder.config(k, v)
    if with_jar:
        builder = builder.config("spark.jars", jvm_ops_jar())
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class Feeder:
    """Writes parquet files into the source folder atomically (staging folder, then rename)."""

    def __init__(self, spark: SparkSession, root: Path, scattered: bool = False) -> None:
        self.spark = spark
        # A 64-bit hash of the key number as 16 hex digits: random ids, each number its own (80 M numbers
        # collide with odds of ~2e-4).
        self.key_expr = "concat('id-', lpad(hex(xxhash64(id)), 16, '0'))" if scattered else "concat('key-', id)"
        self.src = root / "in"
        self.staging = root / "staging"
        self.src.mkdir(parents=True)
        self.n = 0

    def put(self, sql_ids: str) -> None:
        """sql_ids: a SELECT giving one column ``id`` (bigint): the key numbers of this batch."""
        df = self.spark.sql(sql_ids).selectExpr(
            f"{self.key_expr} AS k",
            f"timestamp_micros({BASE_US} + {self.n * 1000} + id % 1000000) AS ts",
            "concat('payload-', id, '-', uuid()) AS payload",
        )
        out = self.staging / f"b{self.n:05d}"
        df.coalesce(1).write.parquet(str(out))
        (part,) = out.glob("part-*.parquet")
        os.rename(part, self.src / f"b{self.n:05d}.parquet")
        self.n += 1


def build_query(spark: SparkSession, impl: str, root: Path, judged_ranges: int = 0) -> Any:
    src: DataFrame = (
        spark.readStream.schema("k string, ts timestamp, payload string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(root / "in"))
        .withWatermark("ts", LATENESS)
    )
    if impl == "jvm":
        judged = {p: [(i * 20, i * 20 + 9, 0) for i in range(judged_ranges // 2)] for p in (0, 1)}
        out = deduplicate_within_window(src, ["k"], "ts", WINDOW_S, judged_late=judged if judged_ranges else None)
    else:
        out = src.dropDuplicatesWithinWatermark(["k"])
    return (
        out.writeStream.format("noop")
        .outputMode("append")
        .option("checkpointLocation", str(root / "ck"))
        .trigger(processingTime="0 seconds")
        .start()
    )


def run_batch(q: Any, feeder: Feeder, sql_ids: str) -> tuple[float, list[dict[str, Any]]]:
    """Feeds one file, waits until processed; returns wall seconds and the progresses it made."""
    before = len(q.recentProgress)
    last_id = q.lastProgress["batchId"] if q.lastProgress else -1
    feeder.put(sql_ids)
    t0 = time.monotonic()
    q.processAllAvailable()
    wall = time.monotonic() - t0
    progs = [p for p in q.recentProgress[max(0, before - 5) :] if p["batchId"] > last_id]
    return wall, progs


def state_rows(progs: list[dict[str, Any]]) -> str:
    """The state's row count as the last progress reports it; n/a where Spark does not track it."""
    for p in reversed(progs):
        if p.get("stateOperators"):
            rows = int(p["stateOperators"][0]["numRowsTotal"])
            return f"{rows:,}" if rows else "n/a"
    return "n/a"


def state_commit_ms(progs: list[dict[str, Any]]) -> int:
    """Milliseconds the batch's state stores took to commit (a RocksDB flush and local checkpoint when a snapshot
    is due, else the changelog)."""
    return sum(int(so.get("commitTimeMs") or 0) for p in progs for so in p.get("stateOperators") or [])


ROCKSDB_FIGURES = ("rocksdbGetCount", "rocksdbGetLatency", "rocksdbReadBlockCacheMissCount", "rocksdbTotalBytesRead",
                   "rocksdbTotalCompactionLatencyMs", "rocksdbSstFileSize")


def rocksdb_figures(progs: list[dict[str, Any]]) -> dict[str, int]:
    """Spark's RocksDB metrics of a batch (ROCKSDB_FIGURES), summed over its state operators: gets, their latency in
    ms, block-cache misses, bytes read from the files, compaction ms, the state's files on disk in bytes."""
    return {name: sum(int((so.get("customMetrics") or {}).get(name) or 0)
                      for p in progs for so in p.get("stateOperators") or []) for name in ROCKSDB_FIGURES}


def drop_page_cache() -> None:
    """Writes dirty pages out and empties the kernel's page cache (Linux, root)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def job_conf() -> dict[str, str]:
    """The Spark settings the job runs examples/sms-dedup.yaml with at a 1 s trigger (contract.spark_conf),
    but for the shuffle partitions, which ``--partitions`` sets."""
    spec = load_example("sms-dedup.yaml")["spec"]
    spec["sink"]["clickhouse"]["batching"]["maxDelay"] = "1s"
    conf = contract.spark_conf(models.GlassPipelineSpec.model_validate(spec))
    conf.pop("spark.sql.shuffle.partitions")
    return conf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=["jvm", "dropdup"], default="jvm")
    ap.add_argument("--sizes", type=comma_separated(int, least=0), default=[0, 1_000_000, 10_000_000],
                    help="live-key counts to measure at")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--build-batch", type=int, default=2_000_000)
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--repeat-share", type=float, default=0.5,
                    help="share of a measured batch's rows that repeat a key already in state")
    ap.add_argument("--scattered-keys", action="store_true", help="keys as random ids (see the module docstring)")
    ap.add_argument("--job-conf", action="store_true", help="Spark settings as glasspipe run gives them")
    ap.add_argument("--drop-page-cache", action="store_true",
                    help="empty the OS page cache before each measured batch (root; see the module docstring)")
    ap.add_argument("--conf", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                    help="an extra Spark setting; repeatable")
    ap.add_argument("--judged-late-ranges", type=int, default=0,
                    help="late ranges of a hand-over the operator carries (jvm only; see the module docstring)")
    ap.add_argument("--json", type=Path, help="append the run's median batch by live keys to this file, one JSON "
                    "object a line (read by bench/targets.py)")
    args = ap.parse_args()
    sizes = sorted(args.sizes)

    if args.drop_page_cache and not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        ap.error("--drop-page-cache needs root on Linux (it writes /proc/sys/vm/drop_caches)")
    root = Path(tempfile.mkdtemp(prefix="gp-bench-dedup-"))
    t0 = time.monotonic()
    confs = {**(job_conf() if args.job_conf else {}), **dict(args.conf)}
    spark = session(args.partitions, with_jar=args.impl == "jvm" or args.job_conf, confs=confs)
    start_s = time.monotonic() - t0
    print(f"impl={args.impl} partitions={args.partitions} keys {'scattered' if args.scattered_keys else 'in order'} "
          f"job conf {args.job_conf} page cache dropped before each batch {args.drop_page_cache} "
          f"confs={dict(args.conf)} judged late ranges {args.judged_late_ranges} "
          f"session start {start_s:.1f} s")
    feeder = Feeder(spark, root, scattered=args.scattered_keys)
    q = None
    live = 0  # keys 0..live-1 are in state
    fresh = 10_000_000_000  # small batches draw new keys from here, away from the build range
    build_rates: list[float] = []
    batch_ms: dict[int, float] = {}  # live keys -> the median small batch's triggerExecution
    try:
        # Warm-up batch so the first measured batch does not pay for query start-up.
        feeder.put(f"SELECT id + {fresh} AS id FROM range(10)")
        fresh += 10
        q = build_query(spark, args.impl, root, args.judged_late_ranges)
        q.processAllAvailable()
        for size in sizes:
            while live < size:
                n = min(args.build_batch, size - live)
                wall, progs = run_batch(q, feeder, f"SELECT id + {live} AS id FROM range({n})")
                data = [p for p in progs if p["numInputRows"] > 0]
                exec_s = sum(p["durationMs"]["triggerExecution"] for p in data) / 1000
                live += n
                build_rates.append(n / exec_s)
                so = data[-1]["stateOperators"][0] if data and data[-1]["stateOperators"] else {}
                if os.environ.get("GP_BENCH_VERBOSE"):
                    print(
                        "   ",
                        data[-1]["durationMs"] if data else None,
                        {k: so.get(k) for k in ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs")},
                    )
                print(
                    f"  build +{n:,} new keys: {exec_s:.1f} s in batch -> {n / exec_s:,.0f} rows/s "
                    f"(wall {wall:.1f} s, state rows {state_rows(progs)})",
                    flush=True,
                )
            lat: list[float] = []
            walls: list[float] = []
            commits: list[int] = []
            rocks: list[dict[str, int]] = []
            for _ in range(args.repeats):
                new = args.small - round(args.small * args.repeat_share)
                # Duplicates: keys spread over the whole state (or of this batch's new keys if empty).
                dups = f"(id * 7919) % {live}" if live else f"id + {fresh}"
                sql = (
                    f"SELECT id + {fresh} AS id FROM range({new}) UNION ALL "
                    f"SELECT {dups} AS id FROM range({args.small - new})"
                )
                fresh += new
                if args.drop_page_cache:
                    drop_page_cache()
                wall, progs = run_batch(q, feeder, sql)
                data = [p for p in progs if p["numInputRows"] > 0]
                lat.append(sum(p["durationMs"]["triggerExecution"] for p in data) / 1000)
                walls.append(wall)
                commits.append(state_commit_ms(data))
                rocks.append(rocksdb_figures(data))
            batch_ms[live] = statistics.median(lat) * 1000
            print(
                f"live keys {live:>11,}: {args.small}-row batch median {batch_ms[live]:,.0f} ms "
                f"(min {min(lat) * 1000:,.0f}, max {max(lat) * 1000:,.0f}; of it the state's commit median "
                f"{statistics.median(commits):,.0f} ms; wall incl. no-data batches "
                f"median {statistics.median(walls) * 1000:,.0f} ms)",
                flush=True,
            )
            med = {name.removeprefix("rocksdb"): statistics.median(r[name] for r in rocks) for name in ROCKSDB_FIGURES}
            print(
                f"    RocksDB, a batch's median: {med['GetCount']:,.0f} gets in {med['GetLatency']:,.0f} ms, "
                f"{med['ReadBlockCacheMissCount']:,.0f} block-cache misses, {med['TotalBytesRead'] / 1e6:,.1f} MB "
                f"read, compactions {med['TotalCompactionLatencyMs']:,.0f} ms; "
                f"files on disk {rocks[-1]['rocksdbSstFileSize'] / 1e9:,.2f} GB",
                flush=True,
            )
        if build_rates:
            print(f"build throughput (all-new keys): median {statistics.median(build_rates):,.0f} rows/s")
        # All-duplicate throughput: a big batch of keys already in state.
        if live >= 1_000_000:
            n = min(args.build_batch, live)
            wall, progs = run_batch(q, feeder, f"SELECT id FROM range({n})")
            data = [p for p in progs if p["numInputRows"] > 0]
            exec_s = sum(p["durationMs"]["triggerExecution"] for p in data) / 1000
            print(f"all-duplicate batch of {n:,}: {exec_s:.1f} s -> {n / exec_s:,.0f} rows/s")
        if args.json:
            with args.json.open("a") as out:
                out.write(json.dumps({"bench": "dedup_state", "impl": args.impl, "small": args.small,
                                      "repeat_share": args.repeat_share, "scattered_keys": args.scattered_keys,
                                      "job_conf": args.job_conf, "batch_ms": batch_ms}) + "\n")
    finally:
        if q is not None:
            q.stop()
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
