"""The hand-over's Arrow writers side by side on a local Spark, without Kafka or ClickHouse: ns a row to write rows
shaped like the sms pipeline's output (four short strings, a timestamp, the Kafka partition, offset and time, three
dead-letter columns that are NULL) as serialized Arrow record batches, with Spark's ``Dataset.toArrowBatchRdd``
and with the ops jar's ``ArrowBatches`` (``glasspipe_job.jvm.arrow_batch_rdd``), in alternating rounds of one
task each (``local[1]``). "rows only" is the same plan without a writer: the cost of making the rows.

    python bench/arrow_batches.py --rows 2000000 --rounds 7 --repeats 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sparkapp"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from glasspipe.contract import REQUIRED_SPARK_CONF
from glasspipe_dev.spark import local_spark_session
from glasspipe_job.jvm import arrow_batch_rdd, jvm_ops_jar

COLUMNS = (
    "concat('sms-', CAST(id AS STRING)) AS sms_id",
    "CASE WHEN id % 3 = 0 THEN 'delivered' ELSE 'sent' END AS status",
    "concat('+4479', CAST(id % 100000000 AS STRING)) AS phone",
    "concat('provider-', CAST(id % 17 AS STRING)) AS provider",
    "timestamp_micros(1764000000000000 + id) AS sent_at",
    "CAST(id % 4 AS INT) AS kafka_partition",
    "id AS kafka_offset",
    "timestamp_micros(1764000000000000 + id) AS kafka_timestamp",
    "CAST(NULL AS STRING) AS dead_letter_reason",
    "CAST(NULL AS STRING) AS dead_letter_value",
    "CAST(NULL AS STRING) AS dead_letter_topic",
)


def ns_a_row(make: Callable[[], Any], rows: int, rounds: int) -> tuple[float, float]:
    """Median and minimum wall ns a row over ``rounds`` runs of ``make()``'s RDD (one task: ``local[1]``)."""
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        make().count()
        times.append((time.perf_counter() - started) * 1e9 / rows)
    return statistics.median(times), min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--rounds", type=int, default=7, help="runs of each writer in a repeat (the median is printed)")
    p.add_argument("--repeats", type=int, default=4, help="repeats, each writer in turn")
    args = p.parse_args()
    spark = local_spark_session("arrow-batches-bench", extra_jars=[jvm_ops_jar()],
                                extra_conf={**REQUIRED_SPARK_CONF, "spark.master": "local[1]"})
    df = spark.range(0, args.rows, 1, 1).selectExpr(*COLUMNS)
    writers: dict[str, Callable[[], Any]] = {
        "Spark's ArrowWriter": lambda: df._jdf.toArrowBatchRdd().toJavaRDD(),
        "ArrowBatches": lambda: arrow_batch_rdd(df, False),
        "rows only": lambda: df._jdf.queryExecution().executedPlan().execute().toJavaRDD(),
    }
    if arrow_batch_rdd(df, False) is None:
        sys.exit("the ops jar's ArrowBatches is not loaded: run `bash dev/install/jvm-ops.sh`")
    print(f"{args.rows} rows of {len(COLUMNS)} columns, one task; wall ns a row, median (min) of {args.rounds} runs")
    medians: dict[str, list[float]] = {name: [] for name in writers}
    for repeat in range(args.repeats):
        for name, make in writers.items():
            median, least = ns_a_row(make, args.rows, args.rounds)
            medians[name].append(median)
            print(f"  repeat {repeat + 1}: {name:20s} {median:6.0f} ({least:.0f})", flush=True)
    rows_only = statistics.median(medians["rows only"])
    for name in ("Spark's ArrowWriter", "ArrowBatches"):
        writing = statistics.median(medians[name]) - rows_only
        print(f"{name:20s} writing: {writing:6.0f} ns a row (median of the repeats' medians, less rows only)")
    spark.stop()


if __name__ == "__main__":
    main()
