"""arrow_partitions on a real local Spark: the parts a batch reaches the sink in."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.mark.parametrize("one_part", [False, True])
def test_a_batch_without_partitions_has_no_part(spark: Any, one_part: bool) -> None:
    # Spark runs a micro-batch without data (no Kafka ranges, no partitions) to move the watermark on; with
    # one_part this once failed the query with "range() arg 3 must not be zero".
    from glasspipe_job.arrow_parts import arrow_partitions

    empty = spark.createDataFrame(spark.sparkContext.emptyRDD(), "k string, n long")
    assert empty.rdd.getNumPartitions() == 0
    assert list(arrow_partitions(empty, batch_rows=10, batch_bound=5, one_part=one_part)) == []


def test_one_part_holds_every_partition_in_order(spark: Any) -> None:
    from glasspipe_job.arrow_parts import arrow_partitions

    df = spark.range(0, 1000, 1, 4).selectExpr("id", "CAST(id AS STRING) AS k")
    parts = list(arrow_partitions(df, batch_rows=1000, batch_bound=250, one_part=True))
    assert len(parts) == 1
    assert parts[0].column("id").to_pylist() == list(range(1000))
    split = list(arrow_partitions(df, batch_rows=1000, batch_bound=250))
    assert [t.num_rows for t in split] == [250, 250, 250, 250]
