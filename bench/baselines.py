"""Baselines in the same run on the same data (issue #15, item 1): what glasspipe costs next to simpler ways.

Starts its own Kafka and ClickHouse, produces N events of bench/workload.py's shape (~200 bytes, ~10 %
repeats, P partitions) once, then measures on that one topic, each variant with its own consumer group
and table:

- ``plain``: one confluent-kafka consumer, ``json.loads``, clickhouse-driver columnar INSERT of
  100 000-row blocks (offsets committed after each INSERT), no dedup: the issue's reference loop;
- ``nodedup``: ``glasspipe run --available-now`` of the sms-dedup pipeline without its ``deduplication``
  (the CRD allows a source without it: the plan is then stateless);
- ``dedup``: the sms-dedup pipeline as bench/bulk.py runs it;
- ``clickhouse``: the plain loop into a ReplacingMergeTree ordered by ``sms_id`` (version = 2^63 - Kafka
  offset, so the first occurrence wins), then the analytical query "count per status" run with FINAL,
  with a GROUP BY/argMax dedup, and on the ``dedup`` variant's clean table (median of 5 each), with the
  rows each table stores (active parts). The right answer is "first": one per first occurrence.

For each ingest it prints wall seconds, events/s, CPU-seconds per million events of the measured
process (this one for the loops, the ``glasspipe run`` process tree for Spark; rusage) and of the Kafka
and ClickHouse servers (/proc/<pid>/stat deltas, taken once ClickHouse's merges have settled), and an
exactness check (rows == N without dedup, rows == keys == first occurrences with it).

    python bench/baselines.py --events 500000
    python bench/baselines.py --events 50000 --only plain,clickhouse
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clickhouse_driver import Client
from confluent_kafka import Consumer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bulk import BATCH, _ts, become_subreaper, children, make_events, reap_orphans
from plain_loop import BLOCK, run_loop
from thread_cpu import process_cpu

from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import again_until, produce, run_to_end, sms_dedup_pipeline

VARIANTS = ("plain", "nodedup", "dedup", "clickhouse")
MAX_OFFSETS = 200_000  # kafka.maxOffsetsPerTrigger of the Spark runs, as bench/bulk.py
COLUMNS = ("sms_id String, status Nullable(String), phone Nullable(String), provider Nullable(String), "
           "sent_at DateTime, seq Nullable(Int64)")


@dataclass(frozen=True)
class Cpu:
    """CPU seconds so far: this process and its reaped children, the Kafka server, the ClickHouse server."""

    own: float
    kafka: float
    clickhouse: float

    def __sub__(self, other: Cpu) -> Cpu:
        return Cpu(self.own - other.own, self.kafka - other.kafka, self.clickhouse - other.clickhouse)


@dataclass
class Bench:
    """The servers and the data every variant reads."""

    kafka: KafkaServer
    ch: ClickHouseServer
    client: Client
    tmp: Path
    topic: str
    n: int
    firsts: int
    servers: set[int]  # our children that are servers, not orphans of a run

    def server_pid(self, server: KafkaServer | ClickHouseServer) -> int:
        proc = server._process.proc if server._process else None
        if proc is None:
            raise RuntimeError(f"{type(server).__name__} is not running")
        return proc.pid

    def cpu(self) -> Cpu:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return Cpu(me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
                   proc_cpu(self.server_pid(self.kafka)), proc_cpu(self.server_pid(self.ch)))

    def settle(self, timeout: float = 60.0) -> None:
        """Wait until ClickHouse merges nothing, so a run's merges are charged to that run."""
        deadline = time.monotonic() + timeout
        while self.client.execute("SELECT count() FROM system.merges")[0][0] and time.monotonic() < deadline:
            time.sleep(0.5)

    def count(self, table: str) -> tuple[int, int]:
        rows, keys = self.client.execute(f"SELECT count(), uniqExact(sms_id) FROM {table}")[0]
        return int(rows), int(keys)


def proc_cpu(pid: int) -> float:
    """utime + stime of a live process (all its threads), in seconds."""
    cpu = process_cpu(pid)
    if cpu is None:
        raise ProcessLookupError(f"process {pid} is gone")
    return cpu


def measure(b: Bench, label: str, run: Callable[[], str], table: str, want: str) -> None:
    """Run one ingest and print its figures; ``run`` returns extra text for the line. ``want``: "events"
    (every record once), "firsts" (each first occurrence once) or "any" (a ReplacingMergeTree: merges
    collapse repeats at their own pace, so its row count proves nothing; the queries check it)."""
    b.settle()
    load = os.getloadavg()[0]
    before = b.cpu()
    started = time.monotonic()
    extra = run()
    wall = time.monotonic() - started
    reap_orphans(b.servers)
    b.settle()
    cpu = b.cpu() - before
    rows, keys = b.count(table)
    exact = {"events": str(rows == b.n), "firsts": str(rows == keys == b.firsts), "any": "n/a"}[want]
    goal = {"events": f"{b.n} events", "firsts": f"{b.firsts} first occurrences", "any": "see the queries"}[want]
    per_m = 1e6 / b.n
    print(f"{label:16s} {b.n} events: {wall:7.1f} s wall, {b.n / wall:8,.0f} ev/s{extra}; CPU-s per M events: "
          f"process {cpu.own * per_m:6,.0f}, Kafka {cpu.kafka * per_m:5,.0f}, ClickHouse "
          f"{cpu.clickhouse * per_m:5,.0f}, total {(cpu.own + cpu.kafka + cpu.clickhouse) * per_m:6,.0f}; "
          f"load {load:.1f}; exact: {exact} ({rows} rows, {keys} keys; want {goal})", flush=True)


def plain_loop(b: Bench, group: str, table: str, versioned: bool) -> str:
    """The reference loop (bench/plain_loop.py): INSERTs of BLOCK rows; stops after N records."""
    run = run_loop(b.kafka.bootstrap, b.topic, group, b.client, table, versioned=versioned, stop_after=b.n)
    return f" (first records after {run.first_after:.1f} s), {run.inserts} INSERTs"


def warm_up_groups(b: Bench) -> None:
    """Commit one offset in a throw-away group: Kafka creates its offsets topic (50 partitions) now, not
    inside the first variant's measurement."""
    consumer = Consumer({"bootstrap.servers": b.kafka.bootstrap, "group.id": "baseline-warm-up",
                         "enable.auto.commit": False})
    try:  # the coordinator answers once the offsets topic is loaded
        again_until(20, lambda: consumer.commit(offsets=[TopicPartition(b.topic, 0, 1)], asynchronous=False))
    finally:
        consumer.close()


def spark_run(b: Bench, name: str, dedup: bool) -> str:
    """``glasspipe run --available-now`` of the sms-dedup pipeline, with or without its deduplication."""
    path = sms_dedup_pipeline(b.tmp, name, b.topic, max_rows=BLOCK, max_offsets=MAX_OFFSETS, seq_field=True,
                              dedup=dedup)
    started = time.time()
    done = run_to_end(path, b.kafka.bootstrap, f"127.0.0.1:{b.ch.port}", b.tmp / f"ckpt-{name}", timeout=7200)
    (b.tmp / f"{name}.log").write_text(done.stderr)
    first = next((_ts(line) for line in done.stderr.splitlines()
                  if (m := BATCH.search(line)) and int(m.group(2)) > 0), None)
    batches = sum(1 for line in done.stderr.splitlines() if BATCH.search(line))
    return (f" (first batch committed after {first - started:.1f} s)" if first else "") + f", {batches} batches"


def queries(b: Bench, replacing: str, clean: str | None, plain: str | None) -> None:
    """The same analytical query on each table: time (median of 5), answer, rows stored."""
    truth = {"first": b.firsts}
    runs = [("(a) ReplacingMergeTree FINAL", replacing,
             f"SELECT status, count() FROM {replacing} FINAL GROUP BY status ORDER BY status"),
            ("(b) ReplacingMergeTree argMax", replacing,
             f"SELECT status, count() FROM (SELECT argMax(status, ver) AS status FROM {replacing} "
             "GROUP BY sms_id) GROUP BY status ORDER BY status")]
    if clean:
        runs.append(("(c) glasspipe clean table", clean,
                     f"SELECT status, count() FROM {clean} GROUP BY status ORDER BY status"))
    else:
        print("(c) glasspipe clean table: skipped (run with the dedup variant)")
    if plain:
        runs.append(("(d) plain table, no dedup", plain,
                     f"SELECT status, count() FROM {plain} GROUP BY status ORDER BY status"))
    for label, table, sql in runs:
        times, answer = [], {}
        for _ in range(5):
            t = time.monotonic()
            answer = dict(b.client.execute(sql))
            times.append(time.monotonic() - t)
        rows, parts = b.client.execute("SELECT sum(rows), count() FROM system.parts WHERE active AND "
                                       f"database = 'default' AND table = '{table}'")[0]
        print(f"{label:30s} {statistics.median(times) * 1000:8.1f} ms (median of 5); {table}: {rows} rows "
              f"stored in {parts} active parts; answer {answer} ({'right' if answer == truth else 'WRONG'})",
              flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=500_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--only", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}")
    args = p.parse_args()
    only = [v.strip() for v in args.only.split(",") if v.strip()]
    if unknown := set(only) - set(VARIANTS):
        p.error(f"--only: unknown {sorted(unknown)}; choose from {','.join(VARIANTS)}")
    become_subreaper()
    with (tempfile.TemporaryDirectory(prefix="gp-baselines-") as d, KafkaServer(long_running=True) as kafka,
          ClickHouseServer() as ch):
        topic = "baseline-sms"
        kafka.create_topic(topic, args.partitions)
        kafka.create_topic(f"{topic}-dlq", 1)
        events, firsts = make_events(args.events, 10_000)
        t = time.monotonic()
        produce(kafka.bootstrap, topic, events)
        del events
        print(f"produced {args.events} events ({args.events - firsts} repeats, {firsts} first occurrences) to "
              f"{args.partitions} partitions in {time.monotonic() - t:.1f} s; machine: {os.cpu_count()} cores, "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
        b = Bench(kafka, ch, ch.client(), Path(d), topic, args.events, firsts, children())
        warm_up_groups(b)
        clean = plain = None
        if "plain" in only:
            b.client.execute(f"CREATE TABLE plain_loop ({COLUMNS}) ENGINE = MergeTree ORDER BY sms_id")
            measure(b, "plain loop", lambda: plain_loop(b, "baseline-plain", "plain_loop", False), "plain_loop",
                    want="events")
            plain = "plain_loop"
        if "nodedup" in only:
            measure(b, "spark, no dedup", lambda: spark_run(b, "bl-nodedup", dedup=False), "bl_nodedup", want="events")
        if "dedup" in only:
            measure(b, "glasspipe dedup", lambda: spark_run(b, "bl-dedup", dedup=True), "bl_dedup", want="firsts")
            clean = "bl_dedup"
        if "clickhouse" in only:
            b.client.execute(f"CREATE TABLE ch_replacing ({COLUMNS}, ver UInt64) "
                             "ENGINE = ReplacingMergeTree(ver) ORDER BY sms_id")
            measure(b, "loop into RMT", lambda: plain_loop(b, "baseline-replacing", "ch_replacing", True),
                    "ch_replacing", want="any")
            queries(b, "ch_replacing", clean, plain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
