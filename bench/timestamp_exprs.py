"""Per-row cost of the job's two timestamp expressions, written with intervals and with micros.

The future-skew check (event time > Kafka timestamp + maxFutureSkew) and the copy of the event time
without its watermark mark run on every record. Adding an interval to a timestamp is a date-time
library call per row; comparing and copying microseconds since the epoch is long arithmetic.

Run: $VENV/bin/python bench/timestamp_exprs.py [--rows N] [--rounds R]
Local Spark, two cores, no servers. Prints core-ns per row for each form and for the bare columns.
"""

from __future__ import annotations

import argparse
import time

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

EPOCH_2026_US = 1_790_000_000_000_000
SKEW_MS = 10_000


def forms() -> dict[str, list[Column]]:
    """The expressions of each form, as the job writes them (transform.py, WindowDedup.java)."""
    return {
        "columns alone": [F.col("et"), F.col("kts")],
        "intervals (before 0829704)": [
            F.col("et") + F.expr("INTERVAL 0 SECONDS"),
            F.col("et") > F.col("kts") + F.expr(f"INTERVAL {SKEW_MS} MILLISECONDS"),
        ],
        "micros (now)": [
            F.timestamp_micros(F.unix_micros("et")),
            F.unix_micros("et") > F.unix_micros("kts") + F.lit(SKEW_MS * 1000),
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=40_000_000)
    ap.add_argument("--rounds", type=int, default=3, help="the first round includes the JIT's warm-up")
    args = ap.parse_args()
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    ts = F.lit(EPOCH_2026_US) + F.col("id") * 1000
    rows = (spark.range(args.rows, numPartitions=2)
            .withColumn("et", F.timestamp_micros(ts))
            .withColumn("kts", F.timestamp_micros(ts + 500)))
    for r in range(args.rounds):
        for name, cols in forms().items():
            started = time.perf_counter()
            (rows.select(*[c.alias(f"c{i}") for i, c in enumerate(cols)])
             .write.format("noop").mode("overwrite").save())
            took = time.perf_counter() - started
            print(f"round {r}  {name:28s} {took:6.2f} s  {took * 2 / args.rows * 1e9:6.1f} core-ns a row "
                  "(both expressions)")
    spark.stop()


if __name__ == "__main__":
    main()
