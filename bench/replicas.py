"""Throughput of 1, 2 and 3 replicas of the sms-dedup pipeline on this machine, and the cost of a rescale.

Starts its own Kafka and ClickHouse, produces N keyed events (20 % duplicates) to a 6-partition topic,
then for each replica count runs that many `glasspipe run` processes (each its own Spark driver, as each
would be its own SparkApplication) on a fresh pipeline until the consumer group's lag is 0.
Prints events/s measured from the first committed batch to the end (Spark start-up excluded) and
wall time including start-up. Then measures a rescale 2 -> 3: the old replicas' stop, and the time from the
new ones' start to each having committed its first batch with the events that arrived meanwhile, and the
warm-up rows re-read.

    python bench/replicas.py --events 200000
    python bench/replicas.py --events 60000 --replicas '' --cds   # drivers map the CDS archive, as in the image
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))

from arg_types import comma_separated

from glasspipe.contract import default_consumer_group
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import (
    dumps,
    group_lag,
    produce,
    sms_dedup_pipeline,
    start_continuous,
    total_of,
    totals,
)

T0 = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)


def events(n: int, dup_share: float, seed: int) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    uniques = int(n * (1 - dup_share))
    out = []
    for i in range(uniques):
        doc = {"sms_id": f"b-{i:08d}", "status": "first", "phone": "+1", "meta": {"provider": "p"},
               "sent_at": (T0 + timedelta(milliseconds=2 * i)).isoformat()}
        out.append((f"b-{i:08d}".encode(), dumps(doc)))
    for _ in range(n - uniques):
        i = rng.randrange(uniques)
        doc = {"sms_id": f"b-{i:08d}", "status": "repeat", "phone": "+1", "meta": {"provider": "p"},
               "sent_at": (T0 + timedelta(milliseconds=2 * i, seconds=1)).isoformat()}
        out.append((f"b-{i:08d}".encode(), dumps(doc)))
    return out


def pipeline(tmp: Path, kafka: KafkaServer, topic: str, name: str) -> Path:
    return sms_dedup_pipeline(tmp, name, topic, max_offsets=50_000, max_rows=100_000)


def lag(kafka: KafkaServer, name: str, topic: str) -> int:
    return sum(max(0, end - max(c, 0)) for c, end in group_lag(kafka.bootstrap, default_consumer_group("default", name),
                                                               topic).values())


def run_replicas(tmp: Path, kafka: KafkaServer, ch: ClickHouseServer, topic: str, n: int, total: int) -> None:
    name = f"bench-{n}r-{uuid.uuid4().hex[:6]}"
    path = pipeline(tmp, kafka, topic, name)
    started = time.monotonic()
    jobs = [start_continuous(path, kafka.bootstrap, f"127.0.0.1:{ch.port}", tmp / f"ckpt-{name}",
                             tmp / f"{name}-{i}.log", "--replica", str(i), "--replicas", str(n)) for i in range(n)]
    first_commit = None
    try:
        while True:
            remaining = lag(kafka, name, topic)
            if first_commit is None and remaining < total:
                first_commit = time.monotonic()
            if remaining == 0:
                break
            for j in jobs:
                if not j.alive():
                    raise RuntimeError(j.log_tail(40))
            time.sleep(0.2)
    finally:
        for j in jobs:
            j.stop(timeout=60)
    done = time.monotonic()
    steady = done - (first_commit or started)
    rows = ch.client().execute(f"SELECT count() FROM {name.replace('-', '_')}")[0][0]
    print(f"{n} replica(s): {total} events in {done - started:.1f} s wall (incl. Spark start-up), "
          f"{steady:.1f} s from the first commit: {total / steady:,.0f} events/s; {rows} rows written")


def rescale(tmp: Path, kafka: KafkaServer, ch: ClickHouseServer, topic: str, more: int) -> None:
    """2 replicas drain the topic and stop; `more` events arrive and 3 new replicas start (a rescale 2 -> 3)."""
    name = f"bench-rescale-{uuid.uuid4().hex[:6]}"
    path = pipeline(tmp, kafka, topic, name)
    ckpt = tmp / f"ckpt-{name}"

    def start(n: int) -> list[Any]:
        return [start_continuous(path, kafka.bootstrap, f"127.0.0.1:{ch.port}", ckpt, tmp / f"{name}-{i}of{n}.log",
                                 "--replica", str(i), "--replicas", str(n)) for i in range(n)]

    def log(i: int) -> str:
        return (tmp / f"{name}-{i}of3.log").read_text()

    jobs = start(2)
    while lag(kafka, name, topic):
        time.sleep(0.5)
    t_stop = time.monotonic()
    for j in jobs:  # SIGTERM: each stops after its batch in flight, as a driver pod does
        j.stop(timeout=60)
    t_stopped = time.monotonic()
    # The new events arrive once the old replicas are gone, so the new ones read them: sent before the stop, a
    # clean stop's last batches took them and the new replicas had nothing to catch up with.
    produce(kafka.bootstrap, topic, events(more, 0.2, 2))
    wall_start = datetime.now()
    t_start = time.monotonic()
    jobs = start(3)
    # caught up: no lag, and each new replica has committed its first batch (the warm-up and the new events)
    while lag(kafka, name, topic) or not all(PHASES[-1][1] in log(i) for i in range(3)):
        assert all(j.alive() for j in jobs), "a new replica exited:\n" + "\n".join(j.log_tail(20) for j in jobs)
        time.sleep(0.2)
    t_caught_up = time.monotonic()
    for j in jobs:
        j.stop(timeout=60)
    summaries = [summary for i in range(3) if (summary := totals(log(i)))]
    warmup = sum(total_of(summary, "warm-up rows") for summary in summaries)
    # a replica stopped before it printed its summary line has no count: say so rather than add 0
    reread = f"{warmup} rows" if len(summaries) == 3 else (
        f"{warmup} rows in the {len(summaries)} of 3 replicas that printed a summary")
    print(f"rescale 2 -> 3: old replicas stopped (each after its batch in flight) in {t_stopped - t_stop:.1f} s; "
          f"{more} new events produced; the new replicas caught up {t_caught_up - t_start:.1f} s after their start "
          f"(Spark start-up, warm-up, the new events), {t_caught_up - t_stop:.1f} s after the stop began; warm-up "
          f"re-read {reread} (window + allowedLateness of each partition)")
    for i in range(3):
        print(f"  new replica {i}: " + phases(log(i), wall_start))


# job log lines that end a start-up phase, in order: (what, where the line starts to match)
PHASES = [("Spark session up", "ClickHouse "), ("ledger read and claimed", "new checkpoint "),
          ("query started", "query started"), ("first batch committed", "batch 0: ")]


def phases(log: str, since: datetime) -> str:
    """Seconds after ``since`` (the new replicas' start) at which a new replica's job log reached each phase."""
    out: list[str] = []
    for line in log.replace("\r", "\n").splitlines():
        head, _, message = line.partition(" INFO ")
        if not message:
            continue
        try:
            at = datetime.strptime(head[-23:], "%Y-%m-%d %H:%M:%S,%f")
        except ValueError:
            continue
        text = message.split(": ", 1)[-1]
        for what, start in PHASES[len(out):len(out) + 1]:
            if text.startswith(start):
                detail = f" ({text.split(' in ', 1)[-1]})" if what == "first batch committed" else ""
                out.append(f"{what} +{(at - since).total_seconds():.1f} s{detail}")
    return ", ".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--replicas", type=comma_separated(int, least=1, example="1,2,3"), default=[1, 2, 3],
                        help="replica counts to drain the topic with; '' for none")
    parser.add_argument("--keep", type=Path, help="write the job logs and checkpoints here (kept)")
    parser.add_argument("--cds", action="store_true",
                        help="drivers map the class-data-sharing archive of dev/install/spark-cds.sh, as the Spark "
                             "image's driver pods map the image's (same class list); default: the JVM's own only")
    args = parser.parse_args()
    if args.cds:
        from glasspipe_dev.spark_cds import archive_path

        archive = archive_path()
        if not archive.is_file():
            parser.error(f"no {archive}: run `bash dev/install/spark-cds.sh` first")
        os.environ["SPARK_SUBMIT_OPTS"] = f"-XX:SharedArchiveFile={archive}"
    with (tempfile.TemporaryDirectory(prefix="gp-bench-") as tmp_s, KafkaServer(long_running=True) as kafka,
          ClickHouseServer() as ch):
        tmp = args.keep or Path(tmp_s)
        tmp.mkdir(parents=True, exist_ok=True)
        topic = "bench-sms"
        kafka.create_topic(topic, 6)
        kafka.create_topic(f"{topic}-dlq", 1)
        produce(kafka.bootstrap, topic, events(args.events, 0.2, 1))
        print(f"produced {args.events} events (20 % duplicates) to 6 partitions")
        for n in args.replicas:
            run_replicas(tmp, kafka, ch, topic, n, args.events)
        rescale(tmp, kafka, ch, topic, max(args.events // 10, 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
