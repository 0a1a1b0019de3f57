"""A pipeline's restart after a crash: how much state changelog it replays, and what its first batch costs.

Starts its own Kafka and ClickHouse, runs the sms-dedup pipeline (`glasspipe run`, one replica, local Spark)
and offers bench/workload.py's stream at ``--rate`` for ``--seconds``; once every first occurrence has
landed and the job is idle, SIGKILLs it (a crash), counts the state store's files in the checkpoint (the
newest snapshot each partition has uploaded and the changelogs after it, which a restart replays), restarts
it on the same checkpoint and offers a trickle. Prints the replay's size, the restarted job's first batches
(Spark's durationMs: their addBatch loads the state) and when the first new row landed, and checks that
every first occurrence landed exactly once.

    python bench/restart.py --rate 10000 --seconds 150 --trigger 250ms --window 2m
    python bench/restart.py --rate 10000 --seconds 150 --trigger 250ms --window 2m \\
        --spark-conf spark.sql.streaming.stateStore.minDeltasForSnapshot=10   # Spark's default, for an A/B
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from arg_types import key_value
from freshness import check_table, pipeline_file
from job_log import JobLog
from landed_rows import Poller, wait_for_rows
from workload import Workload, produce_plan

from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import start_continuous

VERSION = re.compile(r"^(\d+)(?:_[^.]*)?\.(zip|changelog)$")


def replay_size(checkpoint: Path) -> list[tuple[str, int, int, int]]:
    """Per state partition (``state/<operator>/<partition>``): (partition, newest snapshot version, changelogs
    newer than it, their bytes): what a restart reads after the snapshot."""
    out = []
    for part in sorted(p for p in checkpoint.rglob("state/*/*") if p.is_dir() and p.name.isdigit()):
        snapshots, changelogs = [], {}
        for f in part.iterdir():
            m = VERSION.match(f.name)
            if m and m.group(2) == "zip":
                snapshots.append(int(m.group(1)))
            elif m:
                changelogs[int(m.group(1))] = f.stat().st_size
        base = max(snapshots, default=0)
        newer = {v: size for v, size in changelogs.items() if v > base}
        out.append((str(part.relative_to(checkpoint)), base, len(newer), sum(newer.values())))
    return out


def wait_idle(log: Path, quiet: float = 5.0, timeout: float = 120.0) -> None:
    """Until the job has started no batch for ``quiet`` seconds (its no-data batches for timers included)."""
    seen, since, deadline = JobLog.read(log).last_batch(), time.monotonic(), time.monotonic() + timeout
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        time.sleep(0.5)
        now = JobLog.read(log).last_batch()
        if now != seen:
            seen, since = now, time.monotonic()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=10_000, help="offered events/s before the crash")
    p.add_argument("--seconds", type=float, default=150)
    p.add_argument("--trigger", default="1s", help="batching.maxDelay (the micro-batch interval)")
    p.add_argument("--window", default="2m", help="deduplication.window")
    p.add_argument("--trickle", type=float, default=1_000, help="events/s offered for 10 s after the restart")
    p.add_argument("--spark-conf", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                   help="a Spark setting for the pipeline's spec.spark.conf; repeatable")
    args = p.parse_args()
    spark_conf = dict(args.spark_conf)
    with (tempfile.TemporaryDirectory(prefix="gp-restart-") as d, KafkaServer(long_running=True) as kafka,
          ClickHouseServer() as ch):
        tmp, suffix = Path(d), uuid.uuid4().hex[:6]
        topic, table = f"restart-{suffix}", f"restart_{suffix}"
        kafka.create_topic(topic, 4)
        kafka.create_topic(f"{topic}-dlq", 1)
        path = pipeline_file(tmp, topic, table, args.trigger, spark_conf, 100_000, args.window)
        ckpt, bootstrap, clickhouse = tmp / "ckpt", kafka.bootstrap, f"127.0.0.1:{ch.port}"
        job = start_continuous(path, bootstrap, clickhouse, ckpt, tmp / "before.log")
        workload = Workload(seed=int(args.rate))
        poller = Poller(ch, table)
        poller.start()
        burst = workload.plan(int(args.rate * args.seconds), args.rate)
        produce_plan(bootstrap, topic, burst, args.rate)
        wait_for_rows(poller, workload.firsts, [job], 120, "before the crash's rows landed")
        wait_idle(tmp / "before.log")
        batches = JobLog.read(tmp / "before.log").last_batch() + 1
        job.kill()
        landed = poller.rows
        print(f"before the crash: {args.rate:.0f} ev/s for {args.seconds:.0f} s, trigger {args.trigger}, window "
              f"{args.window}, {batches} batches, {landed} first occurrences landed; settings {spark_conf or 'none'}")
        for part, base, n, size in replay_size(ckpt):
            print(f"  {part}: newest snapshot at version {base}, {n} changelogs after it, {size / 1e6:.1f} MB")
        restarted = time.monotonic()
        job = start_continuous(path, bootstrap, clickhouse, ckpt, tmp / "after.log")
        trickle = workload.plan(int(args.trickle * 10), args.trickle)
        producer = threading.Thread(target=produce_plan, args=(bootstrap, topic, trickle, args.trickle), daemon=True)
        producer.start()
        first_row = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and job.alive():
            if first_row is None and poller.rows > landed:  # before the end test: all may land in one batch
                first_row = time.monotonic() - restarted
            if poller.rows >= workload.firsts:
                break
            time.sleep(0.05)
        producer.join()
        poller.stop.set()
        poller.join()
        wait_idle(tmp / "after.log")
        job.stop(timeout=60)
        print(f"after the restart: the first new row landed {first_row or float('nan'):.1f} s after the restart")
        for batch, rows, durations in [b for b in JobLog.read(tmp / "after.log").progress if b[1] > 0][:3]:
            print(f"  batch {batch}: {rows} rows, addBatch {durations.get('addBatch', 0):.0f} ms, "
                  f"triggerExecution {durations.get('triggerExecution', 0):.0f} ms")
        exact, detail = check_table(ch, table, "dedup", workload.firsts, len(burst) + len(trickle), args.window)
        print(f"exact: {exact} ({detail})", flush=True)


if __name__ == "__main__":
    main()
