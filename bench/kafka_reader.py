"""Spark's Kafka reader alone, on a local broker and a local Spark, without JSON, state or ClickHouse: wall time and
CPU-us a record to read a topic of sms events (bench/workload.py, ~200 bytes) with each set of ``kafka.*`` source
options, in alternating rounds, and the broker's CPU meanwhile.

Why: Spark's Kafka consumer (``InternalKafkaConsumer.fetch``) seeks before every poll and, after it, asks the broker
for the partition's earliest and latest offsets (two ListOffsets round trips), so its cost goes with the number of
polls, and a poll returns at most ``max.poll.records`` (Kafka's default 500) records. The job sets 10 000
(``glasspipe_job.config.KAFKA_MAX_POLL_RECORDS``); ``default=`` here is Spark's and Kafka's defaults.

    python bench/kafka_reader.py --records 4000000 --rounds 7 \\
        --variant default= --variant 'poll 10k=kafka.max.poll.records=10000'
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sparkapp"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from thread_cpu import process_cpu
from workload import Workload, fill

from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.spark import local_spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TOPIC = "reader"


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``name=key=value,key=value`` (options may be empty: ``default=``)."""
    name, _, rest = text.partition("=")
    options = dict(item.split("=", 1) for item in rest.split(",") if item)
    return name, options


def fill_topic(kafka: KafkaServer, records: int, partitions: int) -> None:
    """The topic, keyed by sms_id, holding ``records`` events."""
    kafka.create_topic(TOPIC, partitions=partitions)
    fill(kafka.bootstrap, TOPIC, Workload().plan(records, rate=1e9), timeout_s=120)


def read_once(spark: SparkSession, kafka: KafkaServer, options: dict[str, str], records: int) -> tuple[float, ...]:
    """Read the whole topic once with ``options``: (wall s, Spark's CPU-s, the broker's CPU-s)."""
    jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
    reader = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap).option("subscribe", TOPIC)
              .option("startingOffsets", "earliest").option("endingOffsets", "latest").options(**options).load())
    spark_cpu, broker_cpu, started = process_cpu(jvm_pid) or 0, process_cpu(kafka.pid or 0) or 0, time.monotonic()
    [row] = reader.selectExpr("count(*) AS n", "sum(length(value)) AS bytes").collect()
    wall = time.monotonic() - started
    if row["n"] != records:
        sys.exit(f"read {row['n']} records, not {records}")
    return wall, (process_cpu(jvm_pid) or 0) - spark_cpu, (process_cpu(kafka.pid or 0) or 0) - broker_cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="rounds; each reads the topic once with every variant")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE,...",
                   help="a set of kafka.* source options (repeatable); default: Spark's defaults only")
    args = p.parse_args()
    variants = [parse_variant(v) for v in args.variant] or [("default", {})]
    kafka = KafkaServer(long_running=True).start()
    try:
        fill_topic(kafka, args.records, args.partitions)
        spark = local_spark_session("kafka-reader-bench")
        print(f"{args.records} records in {args.partitions} partitions; each round reads the topic once per variant "
              f"(count and sum of the values' lengths); local[2]; {os.cpu_count()} CPUs")
        figures: dict[str, list[tuple[float, ...]]] = {name: [] for name, _ in variants}
        for rnd in range(args.rounds):
            for name, options in variants:
                wall, spark_cpu, broker_cpu = read_once(spark, kafka, options, args.records)
                figures[name].append((wall, spark_cpu * 1e6 / args.records, broker_cpu * 1e6 / args.records))
                print(f"  round {rnd + 1} {name:24s} {wall:6.2f} s wall; CPU-us a record: Spark "
                      f"{figures[name][-1][1]:5.2f}, broker {figures[name][-1][2]:5.2f}", flush=True)
        for name, rows in figures.items():
            wall, spark_us, broker_us = (statistics.median(column) for column in zip(*rows, strict=True))
            print(f"{name:24s} median {wall:6.2f} s wall; CPU-us a record: Spark {spark_us:5.2f}, "
                  f"broker {broker_us:5.2f}")
        spark.stop()
    finally:
        kafka.stop()


if __name__ == "__main__":
    main()
