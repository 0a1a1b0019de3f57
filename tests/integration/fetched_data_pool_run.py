"""``glasspipe run`` in this process, then what Spark's Kafka reader still holds in its pool of fetched records
``--linger`` seconds after the run (tests/integration/test_job_memory.py). Prints one line:
``fetched-data pool: created N, held M``."""

from __future__ import annotations

import sys
import time

from pyspark import SparkContext

from glasspipe.cli import main as cli_main

POOL_OWNER = "org.apache.spark.sql.kafka010.consumer.KafkaDataConsumer$"  # holds the executor's pool


def fetched_data_pool() -> tuple[int, int]:
    """(entries the pool created, entries it holds now): local mode, so the executor's pool is in this JVM."""
    jvm = SparkContext._jvm
    assert jvm is not None, "no Spark JVM in this process"
    owner = jvm.org.apache.spark.util.Utils.classForName(POOL_OWNER, True, False)
    field = owner.getDeclaredField("fetchedDataPool")
    field.setAccessible(True)
    pool = field.get(owner.getField("MODULE$").get(None))
    return int(pool.numCreated()), int(pool.numTotal())


def main(argv: list[str]) -> int:
    linger = 0.0
    if argv[:1] == ["--linger"]:
        linger, argv = float(argv[1]), argv[2:]
    code = cli_main(argv)
    if code == 0:
        time.sleep(linger)
        created, held = fetched_data_pool()
        print(f"fetched-data pool: created {created}, held {held}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
