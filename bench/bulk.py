"""Bulk throughput of one `glasspipe run --available-now` of the sms-dedup pipeline, and where its time goes.

Starts its own Kafka and ClickHouse, produces N events of bench/workload.py's shape (~200 bytes, 10 %
repeats, 4 partitions) once, then runs the pipeline to the end (each run a fresh pipeline name, table,
consumer group and checkpoint, so every run reads the same N records). Per run it prints: wall time of
the whole process (Spark start-up included), seconds to the first committed batch, events/s over the
whole run and from the first batch on, the driver's per-batch write time (batch_writer's log) next to
Spark's per-batch phases (query progress ``durationMs``), and whether the table holds each first
occurrence exactly once.

``--baseline DIR`` runs a second copy of the code (e.g. ``git archive main | tar -x -C DIR``) on the
same data, alternating A B A B, so both are measured under the same machine load. ``--profile DIR``
wraps each run in ``py-spy record`` (driver Python, all threads, idle included) and writes the
collapsed stacks there; ``--jfr DIR`` records the JVM with Java Flight Recorder (both summarised by
``bench/profile_summary.py``).

    python bench/bulk.py --events 200000 --runs 2 --baseline /tmp/gp-main
    python bench/bulk.py --events 1000000 --runs 3 --own-state --keep-digits 5 --baseline /tmp/gp-main
    python bench/bulk.py --events 4000000 --runs 3 --per-partition --baseline /tmp/gp-main
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from thread_cpu import ThreadCpu, process_parents
from workload import Workload

from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import produce, run_argv, sms_dedup_pipeline

REPO = Path(__file__).resolve().parents[1]
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
# "... in 1.23 s" before the job wrote batches in parts, "... in 4 part(s), 1.23 s" since
BATCH = re.compile(r"batch (\d+): (\d+) written, .* ([\d.]+) s")
PROGRESS = re.compile(r"progress of batch (\d+): (\d+) input rows, durations ms (\{.*\})")


def make_events(n: int, rate: float) -> tuple[list[tuple[bytes, bytes]], int]:
    """N events whose event times are spread as if offered at ``rate``/s; returns them and the first
    occurrences among them."""
    w = Workload(seed=11)
    t0 = time.time() - n / rate  # recent: nothing is late against a wall-clock watermark
    out = [w.event(t0 + i / rate)[:2] for i in range(n)]
    return out, w.firsts


def pipeline(tmp: Path, topic: str, name: str, args: argparse.Namespace, spark_conf: dict[str, str]) -> Path:
    return sms_dedup_pipeline(tmp, name, topic, max_offsets=args.max_offsets, max_rows=args.max_rows, seq_field=True,
                              spark_conf=spark_conf, own_state=args.own_state,
                              per_kafka_partition=args.per_partition, source_filter=keep_filter(args.keep_digits))


def keep_filter(digits: int | None) -> str | None:
    """The source filter of ``--keep-digits``: keeps a key whose last digit is below ``digits`` (the same for its
    first occurrence and its repeats), so that 10 - ``digits`` tenths of the records are filtered out."""
    return None if digits is None else f"substring(sms_id, -1, 1) < '{digits}'"


def kept(key: bytes, digits: int | None) -> bool:
    """What ``keep_filter(digits)`` keeps."""
    return digits is None or key[-1:] < str(digits).encode()


def hot_partition(key: bytes, share: float) -> int:
    """Partition 0 for ``share`` of the keys, the others spread over partitions 1-3 (the same key: the same)."""
    h = zlib.crc32(key)
    return 0 if h % 1000 < share * 1000 else 1 + h // 1000 % 3


def parse_variant(text: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """``label:key=value;key=value``: keys starting with ``spark.`` go to the pipeline's spec.spark.conf, the
    others (e.g. ``SPARK_SUBMIT_OPTS``) to the run's environment."""
    label, _, rest = text.partition(":")
    conf: dict[str, str] = {}
    env: dict[str, str] = {}
    for item in filter(None, rest.split(";")):
        k, _, v = item.partition("=")
        (conf if k.startswith("spark.") else env)[k.strip()] = v.strip()
    return label, conf, env


def env_for(code: Path) -> dict[str, str]:
    """PYTHONPATH pointing at the code tree ``code`` (this checkout or a baseline copy)."""
    paths = [str(code / d) for d in ("operator", "sparkapp", "dev", "tests")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def become_subreaper() -> None:
    """Orphans of a run (the Spark JVM outlives its Python parent by a moment) are re-parented to this
    process, so reaping them adds their CPU time to ``os.times().children_*``."""
    import ctypes

    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def children() -> set[int]:
    me = os.getpid()
    return {pid for pid, parent in process_parents().items() if parent == me}


def reap_orphans(keep: set[int], grace: float = 30.0) -> None:
    """Wait for and reap every child not in ``keep`` (the servers): the run's re-parented orphans."""
    deadline = time.monotonic() + grace
    while (left := children() - keep) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)


def _ts(line: str) -> float | None:
    m = LOG_TIME.match(line)
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


def run_once(label: str, code: Path, tmp: Path, kafka: KafkaServer, ch: ClickHouseServer, topic: str, n: int,
             firsts: int, args: argparse.Namespace, spark_conf: dict[str, str],
             extra_env: dict[str, str]) -> dict[str, Any]:
    name = f"bulk-{label}-{uuid.uuid4().hex[:6]}"
    path = pipeline(tmp, topic, name, args, spark_conf)
    argv = run_argv(path, kafka.bootstrap, f"127.0.0.1:{ch.port}", tmp / f"ckpt-{name}", "--available-now")
    if args.profile:
        out = Path(args.profile) / f"{name}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        argv = ["py-spy", "record", "--idle", "--threads", "-r", "50", "-f", "raw", "-o", str(out), "--", *argv]
    env = {**env_for(code), **extra_env}
    if args.jfr:  # every JVM of the run (the driver, which runs the local executors) records to that folder
        Path(args.jfr).mkdir(parents=True, exist_ok=True)
        env["JAVA_TOOL_OPTIONS"] = f"-XX:StartFlightRecording=settings=profile,dumponexit=true,filename={args.jfr}/"
    load = os.getloadavg()[0]
    servers = children()
    cpu0 = os.times()
    started = time.time()
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=stdout, stderr=err, text=True, env=env)
        with ThreadCpu(proc.pid) as threads:
            proc.wait()
        wall = time.time() - started
        stdout.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(argv, proc.returncode, stdout.read(), err.read())
    reap_orphans(servers)
    cpu1 = os.times()
    if done.returncode != 0:
        raise RuntimeError(f"{label} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    (tmp / f"{name}.log").write_text(done.stderr)
    first = None
    batch_s: list[float] = []
    phases: dict[str, float] = {}
    batches = 0
    for line in done.stderr.splitlines():
        if m := BATCH.search(line):
            batch_s.append(float(m.group(3)))
            if first is None and int(m.group(2)) > 0:
                first = _ts(line)
        elif m := PROGRESS.search(line):
            batches += 1
            for k, v in json.loads(m.group(3)).items():
                phases[k] = phases.get(k, 0.0) + float(v) / 1000
    table = name.replace("-", "_")
    rows, distinct = ch.client().execute(f"SELECT count(), uniqExact(sms_id) FROM {table}")[0]
    to_first = (first - started) if first else float("nan")
    child_cpu = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
    res = {"label": label, "wall": wall, "to_first": to_first, "rate": n / wall,
           "steady": n / max(wall - to_first, 1e-9), "batches": batches, "write_s": sum(batch_s),
           "phases": phases, "cpu": child_cpu, "load": load, "exact": rows == distinct == firsts}
    top = ", ".join(f"{k} {v:.1f}" for k, v in sorted(phases.items(), key=lambda kv: -kv[1])[:5])
    print(f"{label:9s} {n} events: {wall:6.1f} s wall ({n / wall:7,.0f} ev/s), first batch committed after "
          f"{to_first:5.1f} s, then {res['steady']:7,.0f} ev/s; {batches} batches, driver write "
          f"{sum(batch_s):5.1f} s; Spark phases s: {top}; CPU {child_cpu:6.1f} s "
          f"({child_cpu / n * 1e6:,.0f} CPU-s per M events); load {load:.1f}; "
          f"exact: {res['exact']} ({rows} rows, {distinct} keys, {firsts} first occurrences)", flush=True)
    threads.print_summary(n)
    return res


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--runs", type=int, default=1, help="runs of each variant")
    p.add_argument("--baseline", type=Path, help="a second code tree to compare, run alternately on the same data")
    p.add_argument("--max-rows", type=int, default=100_000, help="sink.clickhouse.batching.maxRows")
    p.add_argument("--max-offsets", type=int, default=200_000, help="kafka.maxOffsetsPerTrigger")
    p.add_argument("--variant", action="append", default=[], metavar="LABEL:KEY=VALUE;...",
                   help="also run this code with these settings (spark.* keys: the pipeline's spec.spark.conf; "
                   "others: environment, e.g. SPARK_SUBMIT_OPTS), alternately on the same data; repeatable")
    p.add_argument("--profile", help="directory for py-spy's collapsed stacks of each run")
    p.add_argument("--jfr", help="directory for Java Flight Recordings of each run (JVM profile; read with "
                   "bench/profile_summary.py)")
    p.add_argument("--own-state", action="store_true", help="deduplication.ownState (glasspipe's own state after "
                   "the shuffle by key) instead of the default engine")
    p.add_argument("--per-partition", action="store_true", help="deduplication.perKafkaPartition (the topic is "
                   "keyed by the deduplication key) instead of the default engine")
    p.add_argument("--keep-digits", type=int, choices=range(0, 11), metavar="0-10",
                   help="a source filter that keeps the keys whose last digit is below this (5: half the records)")
    p.add_argument("--hot-share", type=float, help="share of the keys on partition 0, the rest evenly on the "
                   "other 3 (a skewed topic); default: Kafka's hashing of the key")
    args = p.parse_args()
    if args.own_state and args.per_partition:
        p.error("--own-state and --per-partition are two engines: choose one")
    if args.hot_share is not None and not 0 <= args.hot_share <= 1:
        p.error("--hot-share takes a share from 0 to 1")
    become_subreaper()
    with (tempfile.TemporaryDirectory(prefix="gp-bulk-") as d, KafkaServer(long_running=True) as kafka,
          ClickHouseServer() as ch):
        tmp = Path(d)
        topic = "bulk-sms"
        kafka.create_topic(topic, 4)
        kafka.create_topic(f"{topic}-dlq", 1)
        events, firsts = make_events(args.events, 10_000)
        landing = len({key for key, _ in events if kept(key, args.keep_digits)})  # first occurrences kept
        t = time.monotonic()
        produce(kafka.bootstrap, topic, events, partition_of=None if args.hot_share is None else
                functools.partial(hot_partition, share=args.hot_share))
        print(f"produced {args.events} events ({args.events - firsts} repeats) to 4 partitions"
              f"{'' if args.hot_share is None else f' ({args.hot_share:.0%} on partition 0)'} in "
              f"{time.monotonic() - t:.1f} s; machine: {os.cpu_count()} cores"
              f"{'' if args.keep_digits is None else f'; the filter keeps {landing} of {firsts} first occurrences'}",
              flush=True)
        variants: list[tuple[str, Path, dict[str, str], dict[str, str]]] = [("this", REPO, {}, {})]
        if args.baseline:
            variants.append(("baseline", args.baseline.resolve(), {}, {}))
        variants += [(label, REPO, conf, env) for label, conf, env in map(parse_variant, args.variant)]
        results: dict[str, list[dict[str, Any]]] = {label: [] for label, *_ in variants}
        for _ in range(args.runs):
            for label, code, conf, env in variants:
                results[label].append(run_once(label, code, tmp, kafka, ch, topic, args.events, landing, args,
                                               conf, env))
        for label, rs in results.items():
            walls = sorted(r["wall"] for r in rs)
            print(f"{label}: median wall {walls[len(walls) // 2]:.1f} s over {len(rs)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
