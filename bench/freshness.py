"""End-to-end freshness of a running glasspipe pipeline at fixed offered rates.

Starts its own Kafka (a broker with its production JIT) and ClickHouse, runs the sms-dedup pipeline
continuously (`glasspipe run`, one replica, local Spark) and offers bench/workload.py's stream (10 % repeats)
at each rate: a warm-up, then ``--settle`` seconds once the warm-up has landed, then the measured window.
The events are made before they are offered (``Workload.plan``), so the producer costs ~3 us an event; the
measured window's are written to the run's scratch folder (``spill_plan``, ~140 bytes an event) and read back a
chunk at a time, so a soak of 100 M events needs that much disk, not memory.
A poller reads ClickHouse every 50 ms (``--poll``) for rows it has not seen (by ``seq``, which numbers first
occurrences; the table is sorted by it); a row's latency is the poll that first saw it minus its
``sent_at`` (the moment it was produced, to the millisecond: the column ``sent_ms``; Kafka appends it
within milliseconds). Figures printed before 2026-11-24 23:45 UTC used the ``DateTime`` column ``sent_at``,
whole seconds, and so read each latency too long by the dropped fraction of a second (0.5 s on average).
Prints, per rate: events offered, rows landed, p50 / p95 / p99 / max latency, whether the pipeline kept up
(every first occurrence landed, exactly once), and the CPU of the pipeline, Kafka, ClickHouse and this
process (producer and poller) while offering, in cores. ``--variant join`` runs issue 15's join scenario instead,
examples/orders-users-join.yaml on matched pairs (bench/join_stream.py): its rates and CPU are a matched pair's.

    python bench/freshness.py --rates 1000,10000 --seconds 60
    python bench/freshness.py --rates 5000 --window 8h --max-rows 5000 --trigger 10s   # the peer's load-test shape
    python bench/freshness.py --variant partition-probe --rates 50000 --window 8h --warmup 60 --warmup-rate 0
    python bench/freshness.py --variant join --rates 1000,10000 --trigger 250ms   # pairs/s, the 1 h join window
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from arg_types import comma_separated, key_value
from exact_check import check_every_event, check_exact
from freshness_runs import EXAMPLE_WINDOW, SustainedSearch, cpu_us_per_event, kept_up, keys_outlive_run
from job_latency import metrics_args, read_latency, summary_text, window_summary
from job_log import JobLog
from join_stream import EXAMPLE_JOIN_WINDOW, RECORDS_A_PAIR, PairWorkload, check_joined, join_pipeline_file, users_topic
from landed_rows import POLL_S, Poller, by_minute, quantile, trend, wait_for_rows
from producer_delays import delays_text
from profile_summary import STACK_DEPTH
from thread_cpu import CpuWindow, descendants
from workload import LINGER_MS, Workload, produce_plan, spill_plan

from glasspipe.api.durations import parse_duration_ms
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.paths import java_binary
from glasspipe_dev.pipelines import CLI, sms_dedup_pipeline, start_continuous
from glasspipe_dev.process import ServerProcess, free_ports


def pipeline_file(tmp: Path, topic: str, table: str, trigger: str, spark_conf: dict[str, str], max_rows: int,
                  window: str | None, max_offsets: int | None = None, dedup: bool = True,
                  per_kafka_partition: bool = False, own_state: bool = False) -> Path:
    # sent_at in epoch milliseconds too: its DateTime column (a timestamp field's default; ClickHouse 18.16
    # has no DateTime64) holds whole seconds, which made every latency read up to a second long
    return sms_dedup_pipeline(tmp, table.replace("_", "-"), topic, max_rows=max_rows, max_delay=trigger,
                              max_offsets=max_offsets, seq_field=True, spark_conf=spark_conf, window=window,
                              extra_columns=[{"name": "sent_ms", "expression": "unix_millis(sent_at)",
                                              "type": "Int64"}],
                              # sorted by seq, so that the poller's "seq > n" reads the newest rows only: sorted
                              # by sms_id, its query read the whole table ten times a second (~0.3 cores of
                              # ClickHouse at 2.4 M rows)
                              order_by=["seq"], dedup=dedup, per_kafka_partition=per_kafka_partition,
                              own_state=own_state)


VARIANTS = {"dedup": "glasspipe, the sms-dedup pipeline",
            "nodedup": "glasspipe, the same pipeline without its deduplication (a stateless plan)",
            "plain": "the plain loop (bench/plain_loop.py, no deduplication): issue 15's reference",
            "partition-probe": "the sms-dedup pipeline with bench/PartitionDedupProbe.java in place of its "
                               "deduplication operator (state per Kafka partition, by time; a probe, not durable)",
            "dedup-partition": "glasspipe, the sms-dedup pipeline with deduplication.perKafkaPartition (the "
                               "topic is partitioned by the key)",
            "dedup-own": "glasspipe, the sms-dedup pipeline with deduplication.ownState (any topic)",
            "join": "glasspipe, the orders-users inner join (bench/join_stream.py; rates and CPU a matched pair: two "
                    "Kafka records, one row)"}
# exact: each first occurrence once (else every event)
DEDUPLICATING = {"dedup", "dedup-partition", "dedup-own", "partition-probe"}


def start_plain_loop(kafka: KafkaServer, ch: ClickHouseServer, topic: str, table: str, trigger: str, max_rows: int,
                     log: Path) -> ServerProcess:
    """bench/plain_loop.py into a table of the pipeline's columns, sorted by seq as the pipeline's is; an INSERT of
    ``max_rows`` at most, at the latest ``trigger`` after its first row, as the pipeline's batching."""
    ch.client().execute(f"CREATE TABLE {table} (sms_id String, status Nullable(String), phone Nullable(String), "
                        "provider Nullable(String), sent_at DateTime, seq Int64, sent_ms Int64) "
                        "ENGINE = MergeTree ORDER BY seq")
    argv = [sys.executable, str(Path(__file__).with_name("plain_loop.py")), "--bootstrap", kafka.bootstrap,
            "--topic", topic, "--group", f"plain-{table}", "--clickhouse", f"127.0.0.1:{ch.port}", "--table", table,
            "--max-delay", str(parse_duration_ms(trigger) / 1000), "--block", str(max_rows)]
    return ServerProcess("plain-loop", argv, log).start()


def replica_args(replica: int, replicas: int) -> tuple[str, ...]:
    """``glasspipe run``'s arguments for one replica of ``replicas`` (none for a single one)."""
    return ("--replica", str(replica), "--replicas", str(replicas)) if replicas > 1 else ()


def replica_log(tmp: Path, table: str, replica: int) -> Path:
    """Replica 0's log is the run's job log (its batches' phases are the ones printed)."""
    return tmp / (f"{table}.log" if replica == 0 else f"{table}-{replica}.log")


def _jcmd(root: int | None, *command: str) -> None:
    """Run a jcmd command against the Java process under ``root`` (the pipeline's Spark driver)."""
    java = [pid for pid in descendants(root) if Path(f"/proc/{pid}/comm").read_text().strip() == "java"] if root else []
    if not java:
        raise RuntimeError("no Java process under the pipeline to profile")
    subprocess.run([str(Path(java_binary()).parent / "jcmd"), str(java[0]), *command], check=True,
                   capture_output=True)


def jfr_driver_options(start_file: Path) -> str:
    """The Spark driver's JVM options for --jfr: deep stacks, so that samples keep their Spark operator, and a 1 s
    recording at start-up. JFR's first start instruments java.io's and Throwable's classes, which in a warm JVM
    throws away the compiled code that inlined them: started only for the measured window, the JIT compiler
    took 0.58 cores of it at 10 000/s against 0.08 without JFR (docs/benchmarks-journal.md, 2026-11-28 night).
    At start-up nothing is compiled yet. SPARK_SUBMIT_OPTS reaches the driver's JVM, not spark-submit's launcher,
    whose output is the driver's command line."""
    own = os.environ.get("SPARK_SUBMIT_OPTS", "")
    return (f"{own} -XX:FlightRecorderOptions=stackdepth={STACK_DEPTH} "
            f"-XX:StartFlightRecording=name=gp-start,duration=1s,filename={start_file}").strip()


def measure(kafka: KafkaServer, ch: ClickHouseServer, tmp: Path, rate: float, seconds: float, trigger: str,
            warmup: float, warmup_rate: float, spark_conf: dict[str, str], max_rows: int = 100_000,
            window: str | None = None, jfr: Path | None = None, settle: float = 0.0,
            code: Path | None = None, poll: float = POLL_S, linger_ms: int = LINGER_MS,
            max_offsets: int | None = None, scattered_keys: bool = False, variant: str = "dedup",
            keep_log: Path | None = None, replicas: int = 1) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:6]
    topic, table = f"fresh-{suffix}", f"fresh_{suffix}"
    kafka.create_topic(topic, 4)
    kafka.create_topic(f"{topic}-dlq", 1)
    if variant == "join":  # ``topic`` has the orders
        kafka.create_topic(users_topic(topic), 4)
        window = window or EXAMPLE_JOIN_WINDOW
    ports = free_ports(replicas) if variant != "plain" else []  # each replica's metrics
    if variant == "plain":
        jobs = [start_plain_loop(kafka, ch, topic, table, trigger, max_rows, tmp / f"{table}.log")]
    else:
        path = join_pipeline_file(tmp, topic, table, trigger, spark_conf, max_rows, window) if variant == "join" \
            else pipeline_file(tmp, topic, table, trigger, spark_conf, max_rows, window, max_offsets=max_offsets,
                               dedup=variant in DEDUPLICATING, per_kafka_partition=variant == "dedup-partition",
                               own_state=variant == "dedup-own")
        env = {"SPARK_SUBMIT_OPTS": jfr_driver_options(tmp / f"jfr-start-{suffix}.jfr")} if jfr is not None else {}
        if code is not None:  # another code tree's job (e.g. `git archive main | tar -x -C DIR`), for an A/B
            env["PYTHONPATH"] = ":".join(str(code / d) for d in ("operator", "sparkapp"))
        # the probe: the same command line, through bench/partition_probe_run.py
        launcher = (sys.executable, str(Path(__file__).with_name("partition_probe_run.py"))) \
            if variant == "partition-probe" else CLI
        jobs = [start_continuous(path, kafka.bootstrap, f"127.0.0.1:{ch.port}", tmp / f"ckpt-{suffix}",
                                 replica_log(tmp, table, i), *replica_args(i, replicas), *metrics_args(ports, i),
                                 env=env or None,
                                 launcher=launcher) for i in range(replicas)]
    try:
        workload = PairWorkload(topic) if variant == "join" else Workload(seed=int(rate), scattered_keys=scattered_keys)
        # the rates are events/s, or for the join matched pairs/s, each two Kafka records: records/s
        per = RECORDS_A_PAIR if variant == "join" else 1
        offer, warm_offer = rate * per, warmup_rate * per
        # Spark starts and runs its first batches; at a high warm-up rate the JIT compiles the hot paths too
        warm = produce_plan(kafka.bootstrap, topic, workload.plan(int(warm_offer * warmup), warm_offer), warm_offer)
        # made while the pipeline drains the warm-up; its first ``settle`` seconds are offered but not measured: the
        # pipeline runs micro-batches of the measured size for a while before its latency counts
        plan = spill_plan(lambda n: workload.plan(n, offer), int(offer * (settle + seconds)), tmp / f"plan-{suffix}")
        poller = Poller(ch, table, poll)
        poller.start()
        wait_for_rows(poller, workload.firsts - (len(plan) - plan.repeats), jobs, math.inf,
                      "before the warm-up's rows landed")
        first_batch = JobLog.read(tmp / f"{table}.log").last_batch() + 1
        pids = [job.proc.pid if job.proc else None for job in jobs]
        pipeline = pids[0]
        others = {f"replica {i}": pid for i, pid in enumerate(pids) if i}
        with CpuWindow({"pipeline": pipeline, **others, "Kafka": kafka.pid, "ClickHouse": ch.pid},
                       by_thread="pipeline") as win:
            if jfr is not None:
                recording = jfr.with_name(f"{jfr.stem}-{int(rate)}{jfr.suffix or '.jfr'}")
                _jcmd(pipeline, "JFR.start", "name=gp-fresh", "settings=profile", f"filename={recording}")
            began = time.time() + settle  # rows sent from here on are measured
            job_before = read_latency(ports)
            poller_cpu = poller.cpu
            got = produce_plan(kafka.bootstrap, topic, plan, offer, linger_ms)
            poller_cpu = poller.cpu - poller_cpu
            if jfr is not None:
                _jcmd(pipeline, "JFR.stop", "name=gp-fresh")
                print(f"  JFR of the measured window: {recording}", flush=True)
        cpu = {**win.trees, "bench (producer, poller)": got["cpu"], "of which the poller": poller_cpu}
        cpu["pipeline"] += sum(cpu.pop(name) for name in others)  # every replica's
        by_thread = win.threads  # replica 0's
        produced_at = time.monotonic()
        wait_for_rows(poller, workload.firsts, jobs, 120, "before the measured rows landed")
        drained = time.monotonic() - produced_at
        poller.stop.set()
        poller.join()
        lat, sent = poller.values(since=began)
        job_latency = window_summary(job_before, read_latency(ports), lat)
        exact, checked = check_table(ch, table, variant, workload.firsts, int(warm["events"] + got["events"]),
                                     window or EXAMPLE_WINDOW)
        job_log = JobLog.read(tmp / f"{table}.log")
        phases = job_log.phases(first_batch)
        batches = phases.pop("batches", 0)
        # each a pass over every latency of the measured window (90 M in a half-hour soak): reckoned once
        p50, p95, p99, slowest = (quantile(lat, q) for q in (0.5, 0.95, 0.99, 1))
        early, late = trend(sent, lat)
        # a state that only grows (no key expires; one replica reads every row): what a row costs as it does
        grows = replicas == 1 and variant in DEDUPLICATING and keys_outlive_run(
            parse_duration_ms(window or EXAMPLE_WINDOW) / 1000, seconds)
        run = {"variant": variant, "replicas": replicas, "offered": got["rate"] / per, "seconds": got["seconds"],
               "measured_s": seconds,  # the measured window: the last of the "seconds" offered (``settle`` before it)
               "began": began,  # epoch s the measured window began: bench/machine_sampler.py --by-minute --since
               "warmup_rate": warmup_rate, "settle": settle,
               "trigger": trigger, "poll_s": poll, "linger_ms": linger_ms,
               "max_rows": max_rows, "window": window, "max_offsets": max_offsets,  # None: the example's / derived
               "scattered_keys": scattered_keys, "spark_conf": spark_conf,  # --spark-conf's settings, {} without
               # Kafka records offered in the measured window (a join's pair is two) and the repeats among them
               "events": got["events"], "repeats": got["repeats"],
               "landed": len(lat), "exact": exact, "exact_detail": checked,
               "p50": p50, "p95": p95, "p99": p99, "max": slowest, "first_fifth": early,
               "last_fifth": late, "drained": drained, "batches": batches, "phases_ms": phases,
               "job_latency": job_latency,  # the pipeline's own histogram over the offered window (None: the loop)
               "producer": got["producer"],  # how long the measured window's records took to reach the broker
               "phases_by_fifth_ms": job_log.phases_by_fifth(first_batch),
               "trigger_us_per_row_by_fifth": job_log.cost_by_fifth(first_batch),
               # [keys up to, us a row]; [] where keys expire
               "trigger_us_per_row_by_live_keys": job_log.cost_by_live_keys(workload.firsts) if grows else [],
               # [minute, p50, p95, p99] of the measured window's rows by the minute they were sent: a long run's shape
               "by_minute": [[m, *percentiles] for m, percentiles in by_minute(sent, lat).items()],
               # first occurrences in all, seen by the end of the wait, and of the measured window's events
               "firsts": workload.firsts, "firsts_seen": poller.rows, "firsts_measured": len(plan) - plan.repeats,
               "cpu_cores": {k: v / got["seconds"] for k, v in cpu.items()},
               "pipeline_cores_by_thread": {k: v / got["seconds"] for k, v in by_thread.items()}}
        print("\n".join(run_text(run)), flush=True)
        return run
    finally:
        shutil.rmtree(tmp / f"plan-{suffix}", ignore_errors=True)
        for job in jobs:
            job.stop(timeout=60)
        for log in (replica_log(tmp, table, i) for i in range(len(jobs))):
            if keep_log is not None and log.exists():
                keep_log.mkdir(parents=True, exist_ok=True)
                shutil.copy(log, keep_log / f"{variant}-{int(rate)}-{log.name}")


def check_table(ch: ClickHouseServer, table: str, variant: str, firsts: int, events: int,
                window: str) -> tuple[bool, str]:
    """Whether the run's table is exact for its variant (each pair's row once; each key's first occurrence once; or,
    without deduplication, every one of the ``events`` offered), and the counts that say so."""
    if variant == "join":
        return check_joined(ch, table, firsts)
    if variant in DEDUPLICATING:
        exact, rows, distinct, reopened, too_close = check_exact(ch, table, firsts, window)
        return exact, (f"{rows} rows, {distinct} keys, {firsts} first occurrences, {reopened} repeats a window or "
                       f"more after their key's first row, {too_close} keys with two rows less than a window apart")
    exact, rows, seen = check_every_event(ch, table, events, firsts)
    return exact, (f"{rows} rows of {events} events, {seen} distinct first occurrences of {firsts}; no "
                   "deduplication: every event lands")


def run_text(run: dict[str, Any]) -> list[str]:
    """A run's figures as the lines printed, read from its record alone (what ``--json`` stores), so that the
    printout and the stored figures cannot disagree."""
    join = run["variant"] == "join"
    offered = (f"{run['offered']:8.0f} pairs/s for {run['seconds']:.0f} s ({run['events']:.0f} records; "
               f"join window {run['window']}" if join else
               f"{run['offered']:8.0f} ev/s for {run['seconds']:.0f} s ({run['events']:.0f} events, "
               f"{run['repeats']:.0f} repeats; {'scattered' if run['scattered_keys'] else 'ordered'} keys")
    shape = f", {run['replicas']} replicas" if run["replicas"] > 1 else ""
    lines = [f"{VARIANTS[run['variant']]}{shape}: offered {offered}; trigger {run['trigger']}; producer linger "
             f"{run['linger_ms']} ms; the last {run['measured_s']:.0f} s measured): landed {run['landed']} rows; "
             f"latency (polled every {run['poll_s'] * 1000:.0f} ms) p50 {run['p50']:.2f} s, p95 {run['p95']:.2f} s, "
             f"p99 {run['p99']:.2f} s, max {run['max']:.2f} s; exact: {run['exact']} ({run['exact_detail']})"]
    lines.append("  latency by minute of the measured window, p50 / p95 / p99: " + "; ".join(
        f"{m}: {a:.2f} / {b:.2f} / {c:.2f} s" for m, a, b, c in run["by_minute"]))
    if run.get("job_latency"):  # runs recorded before it have none
        lines.append(summary_text(run["job_latency"]))
    if run.get("producer"):  # nor this
        lines.append(delays_text(run["producer"]))
    drained, firsts = run["drained"], run["firsts"]
    landed = (f"all landed {drained:.1f} s after the last event was produced" if run["firsts_seen"] >= firsts
              else f"NOT all landed: {run['firsts_seen']} of {firsts} first occurrences seen {drained:.1f} s "
              "after the last event was produced (the wait's limit; the exactness check above saw a table "
              "still filling)")
    lines.append(f"  median latency of the first fifth {run['first_fifth']:.2f} s, of the last fifth "
                 f"{run['last_fifth']:.2f} s; {landed}")
    lines.append("  CPU while offering, in cores: " + ", ".join(f"{k} {v:.2f}" for k, v in run["cpu_cores"].items())
                 + f"; the pipeline {cpu_us_per_event(run, 'pipeline'):.0f} CPU-us per {'pair' if join else 'event'}")
    lines.append(f"  {'replica 0' if run['replicas'] > 1 else 'the pipeline'}'s CPU by kind of thread, in cores: "
                 + ", ".join(f"{g.split(' (')[0]} {v:.2f}" for g, v in
                             sorted(run["pipeline_cores_by_thread"].items(), key=lambda kv: -kv[1]) if v >= 0.01))
    if run["batches"]:
        lines.append(f"  per micro-batch while measuring (median ms over {run['batches']:.0f} batches with data): "
                     + ", ".join(f"{k} {v:.0f}" for k, v in sorted(run["phases_ms"].items(), key=lambda kv: -kv[1])))
    if run["phases_by_fifth_ms"]:
        lines.append("  by fifth of those batches, median ms of the trigger / foreachBatch / its Spark job: "
                     + "; ".join(f"{t:.0f} / {f:.0f} / {j:.0f}" for t, f, j in run["phases_by_fifth_ms"]))
    if run["trigger_us_per_row_by_fifth"]:
        lines.append("  by fifth of the batches with data, the trigger's us an input row (median rows a batch): "
                     + "; ".join(f"{us:.1f} ({rows})" for us, rows in run["trigger_us_per_row_by_fifth"]))
    if len(run["trigger_us_per_row_by_live_keys"]) > 1:
        lines.append("  by ten million live keys (none expired), the trigger's us an input row: " + "; ".join(
            f"to {upto / 1e6:.0f} M {us:.1f}" for upto, us in run["trigger_us_per_row_by_live_keys"]))
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", type=comma_separated(float, least=1.0), default=[1000.0, 10000.0],
                   help="offered events/s (the join: matched pairs/s), comma-separated")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--trigger", default="1s", help="batching.maxDelay (the micro-batch interval)")
    p.add_argument("--max-rows", type=int, default=100_000, help="batching.maxRows (rows per ClickHouse INSERT)")
    p.add_argument("--max-offsets", type=int, help="kafka.maxOffsetsPerTrigger (records per micro-batch; default: "
                   "derived from the driver's heap, as a pipeline without the field)")
    p.add_argument("--window", help="deduplication.window (default: the example's 5m); the peer's load test: 8h; "
                   "the join: join.window (default: the example's 1h, issue 15's)")
    p.add_argument("--warmup", type=float, default=20, help="seconds of a warm-up stream before measuring")
    p.add_argument("--warmup-rate", type=float, default=50,
                   help="events/s of the warm-up stream; 0: the measured rate (a warmed-up JVM, as in a "
                   "long-running pipeline)")
    p.add_argument("--settle", type=float, default=15, help="seconds offered at the measured rate after the "
                   "warm-up has landed and before the measured window")
    p.add_argument("--json", type=Path, help="append each rate's figures to this file, one JSON object a line "
                   "(bench/plot.py reads it)")
    p.add_argument("--jfr", type=Path, help="record the driver JVM with Java Flight Recorder while offering: "
                   "FILE-<rate>.jfr (bench/profile_summary.py --jfr reads it)")
    p.add_argument("--poll", type=float, default=POLL_S, help="seconds between the poller's reads of ClickHouse: "
                   "a latency reads up to this much long (half of it on average)")
    p.add_argument("--linger-ms", type=int, default=LINGER_MS, help="the producer's linger.ms while measuring: "
                   "longer sends fewer, larger requests (less CPU for the producer and the broker on this machine); "
                   "a record's wait in the producer counts in its latency")
    p.add_argument("--code", type=Path, help="run the job of this code tree instead of this checkout's (an A/B "
                   "against e.g. `git archive main | tar -x -C DIR`; its JVM operators jar must be built: "
                   "dev/install/jvm-ops.sh from that tree)")
    p.add_argument("--spark-conf", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                   help="a Spark setting for the pipeline's spec.spark.conf (e.g. spark.eventLog.enabled=true); "
                   "repeatable")
    p.add_argument("--scattered-keys", action="store_true",
                   help="keys scattered over the key space (16 hex digits, as random ids are) instead of made in "
                   "order, each after the last: the state's RocksDB writes and reads lose their locality")
    p.add_argument("--keep-logs", type=Path, help="copy each run's job log into this directory")
    p.add_argument("--replicas", type=int, default=1,
                   help="run the pipeline as this many replicas (glasspipe run --replica i --replicas N, a driver "
                   "each, all on this machine's cores; the topics have 4 partitions); CPU is all of theirs")
    p.add_argument("--find-sustained", type=float, metavar="STEP",
                   help="find the sustained rate instead of running each of --rates: from --rates' one rate, up by "
                   "STEP events/s (pairs/s) while a run keeps up, down while none has; then --refine halvings of the "
                   "last step; prints the highest rate that kept up and the lowest that did not")
    p.add_argument("--refine", type=int, help="with --find-sustained: halvings of the step between the rate that "
                   "kept up and the one above that did not (one run each; default 1)")
    p.add_argument("--variant", choices=sorted(VARIANTS), default="dedup",
                   help="; ".join(f"{k}: {v}" for k, v in VARIANTS.items()))
    args = p.parse_args()
    if args.variant == "plain" and (args.jfr or args.code or args.spark_conf):
        p.error("--jfr, --code and --spark-conf are for the pipeline's JVM: not with --variant plain")
    if args.variant == "join" and (args.scattered_keys or args.max_offsets is not None):
        p.error("--scattered-keys and --max-offsets shape the SMS stream's pipeline: not with --variant join")
    if args.replicas < 1 or (args.replicas > 1 and args.variant in ("plain", "partition-probe")):
        p.error("--replicas takes 1 or more, and more than 1 is for glasspipe's own variants")
    if args.refine is not None and args.find_sustained is None:
        p.error("--refine halves --find-sustained's step: give --find-sustained STEP too, or drop --refine")
    rates = args.rates
    if not rates:
        p.error("--rates: give one or more offered rates, e.g. --rates 1000,10000")
    search = None
    if args.find_sustained is not None:
        if len(rates) != 1:
            p.error("--find-sustained starts from one rate: give --rates a single rate")
        try:
            search = SustainedSearch(rates[0], args.find_sustained, 1 if args.refine is None else args.refine)
        except ValueError as e:
            p.error(f"--find-sustained / --refine: {e}")
    spark_conf = dict(args.spark_conf)
    with (tempfile.TemporaryDirectory(prefix="gp-fresh-") as d, KafkaServer(long_running=True) as kafka,
          ClickHouseServer() as ch):
        for rate in rates if search is None else search.rates():
            res = measure(kafka, ch, Path(d), rate, args.seconds, args.trigger, args.warmup, args.warmup_rate or rate,
                          spark_conf, max_rows=args.max_rows, window=args.window, jfr=args.jfr, settle=args.settle,
                          code=args.code.resolve() if args.code else None, poll=args.poll,
                          linger_ms=args.linger_ms, max_offsets=args.max_offsets,
                          scattered_keys=args.scattered_keys, variant=args.variant, replicas=args.replicas,
                          keep_log=args.keep_logs)
            if args.json:
                with args.json.open("a") as out:
                    out.write(json.dumps({"bench": "freshness", **res}) + "\n")
            held = kept_up(res)
            print(f"  {'kept up' if held else 'did not keep up'} at {rate:.0f} by bench/freshness_runs.py's rule (all "
                  "landed, exact, latency flat, the backlog gone at once)", flush=True)
            if search is not None:
                search.record(rate, held)
    if search is not None:
        print(search.verdict("pairs/s" if args.variant == "join" else "events/s"), flush=True)


if __name__ == "__main__":
    main()
