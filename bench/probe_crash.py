"""Deduplication per Kafka partition killed at random moments: does it lose or double anything?

Runs the sms-dedup pipeline with ``deduplication.perKafkaPartition`` (its state in Spark's state store, versioned by
batch), or with ``--probe partition`` bench/PartitionDedupProbe.java in its place (bench/partition_probe_run.py: the
same layout in a RocksDB of its own, not checkpointed), SIGKILLs the job once in each stretch of its output, at a
random row of it (glasspipe_dev.crashes.kill_mid_stream), restarts it from its checkpoint, drains what is left and
prints what landed: exact when every first occurrence landed once and no repeat did.
tests/integration/test_job_dedup.py checks the job's engines the same way; this prints the probe's failure beside it.

    python bench/probe_crash.py [--kills 6] [--probe per-kafka-partition|partition]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "dev"))

from glasspipe_dev.clickhouse import ClickHouseServer  # noqa: E402
from glasspipe_dev.crashes import kill_mid_stream  # noqa: E402
from glasspipe_dev.kafka import KafkaServer  # noqa: E402
from glasspipe_dev.pipelines import (  # noqa: E402
    CLI,
    dumps,
    produce,
    run_to_end,
    sms_dedup_pipeline,
    start_continuous,
)

T0 = datetime(2026, 11, 1, 8, 0, tzinfo=UTC)
RUNNER = str(Path(__file__).with_name("partition_probe_run.py"))
WHAT = {"per-kafka-partition": "the job's deduplication.perKafkaPartition",
        "partition": "the partition probe (bench/PartitionDedupProbe.java)"}


def sms(sms_id: str, status: str, at: datetime) -> tuple[bytes, bytes]:
    doc = {"sms_id": sms_id, "status": status, "phone": "+100", "meta": {"provider": "p"}, "sent_at": at.isoformat()}
    return sms_id.encode(), dumps(doc)


def count(ch: ClickHouseServer, table: str) -> int:
    try:
        return int(ch.client().execute(f"SELECT count() FROM {table}")[0][0])
    except Exception:  # the table is created by the job's first batch
        return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=6)
    p.add_argument("--uniques", type=int, default=30_000)
    p.add_argument("--repeats", type=int, default=6_000)
    p.add_argument("--probe", choices=("per-kafka-partition", "partition"), default="per-kafka-partition",
                   help="per-kafka-partition: the job's deduplication.perKafkaPartition; partition: the first probe")
    p.add_argument("--seed", type=int, default=5)
    args = p.parse_args()
    launcher = CLI if args.probe == "per-kafka-partition" else (sys.executable, RUNNER)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="gp-probe-crash-") as d, KafkaServer() as kafka, \
            ClickHouseServer() as ch:
        tmp = Path(d)
        suffix = uuid.uuid4().hex[:6]
        topic, table = f"crash-{suffix}", f"crash_{suffix}"
        kafka.create_topic(topic, 4)
        kafka.create_topic(f"{topic}-dlq", 1)
        path = sms_dedup_pipeline(tmp, table.replace("_", "-"), topic, max_rows=1000, max_delay="200ms",
                                  max_offsets=1500, per_kafka_partition=args.probe == "per-kafka-partition")
        records = [sms(f"c-{i:06d}", "first", T0 + timedelta(milliseconds=20 * i)) for i in range(args.uniques)]
        for _ in range(args.repeats):
            i = rng.randrange(args.uniques)
            records.append(sms(f"c-{i:06d}", "repeat", T0 + timedelta(milliseconds=20 * i, seconds=3)))
        produce(kafka.bootstrap, topic, records)  # keyed by sms_id: the topic is partitioned by the key
        ckpt, clickhouse = tmp / "ckpt", f"127.0.0.1:{ch.port}"
        counts = kill_mid_stream(
            lambda: start_continuous(path, kafka.bootstrap, clickhouse, ckpt, tmp / "job.log", launcher=launcher),
            lambda: count(ch, table), rng, args.uniques, kills=args.kills)
        run_to_end(path, kafka.bootstrap, clickhouse, ckpt, launcher=launcher)
        rows, distinct, repeats = ch.client().execute(
            f"SELECT count(), uniqExact(sms_id), countIf(status != 'first') FROM {table}")[0]
        exact = (rows, distinct, repeats) == (args.uniques, args.uniques, 0)
        print(f"{WHAT[args.probe]}, {len(counts)} kills (rows after each: {counts}): {rows} rows, {distinct} keys, "
              f"{repeats} repeats landed, of {args.uniques} first occurrences and {args.repeats} repeats: "
              f"exact: {exact}")
        return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
