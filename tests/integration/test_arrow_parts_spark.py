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


def _columns_of_every_kind(spark: Any, rows: int) -> Any:
    """Each type ArrowBatches fills, with NULLs, empty and multi-byte strings, and strings long enough to grow the
    vectors' data buffers past what they were allocated with, over 3 partitions."""
    return spark.range(0, rows, 1, 3).selectExpr(
        "id",
        "CASE WHEN id % 5 = 0 THEN NULL WHEN id % 7 = 0 THEN '' "
        "ELSE concat('é€', repeat('x', CAST(id % 300 AS INT)), CAST(id AS STRING)) END AS s",
        "CASE WHEN id % 3 = 0 THEN NULL ELSE CAST(concat('b', CAST(id AS STRING)) AS BINARY) END AS b",
        "CASE WHEN id % 4 = 1 THEN NULL ELSE id * 1000003 END AS n",
        "CAST(id AS INT) AS i", "CAST(id % 30000 AS SMALLINT) AS sh", "CAST(id % 100 AS TINYINT) AS t",
        "CASE WHEN id % 6 = 2 THEN NULL ELSE id / 7.0D END AS d", "CAST(id AS FLOAT) / 3 AS f",
        "CASE WHEN id % 9 = 4 THEN NULL ELSE id % 2 = 0 END AS flag",
        "date_add(DATE'2026-01-01', CAST(id AS INT)) AS day",
        "CASE WHEN id % 8 = 3 THEN NULL ELSE timestamp_micros(1764000000000000 + id * 1000001) END AS ts",
        "CAST(timestamp_micros(id) AS TIMESTAMP_NTZ) AS ntz",
        "CASE WHEN id % 11 = 0 THEN NULL ELSE 'same' END AS marker",
        "CASE WHEN id % 10 = 7 THEN NULL ELSE CAST(id AS DECIMAL(10, 2)) / 8 - 300 END AS price",
        "CAST(id AS DECIMAL(20, 0)) * 9223372036854775 - 5 AS wide",
    )


def _read_batches(rdd: Any, schema: Any) -> tuple[int, Any]:
    import pyarrow as pa

    batches = [pa.ipc.read_record_batch(pa.py_buffer(bytes(b)), schema) for b in rdd.collect()]
    return len(batches), pa.Table.from_batches(batches, schema=schema)


@pytest.mark.parametrize(("max_records", "large"), [(100, False), (0, False), (1000, True)])
def test_the_jar_writes_the_batches_spark_writes(spark: Any, max_records: int, large: bool) -> None:
    # ArrowBatches fills the vectors itself: the batches must read back as Spark's own writer's do, value for value,
    # NULL for NULL, split at the same rows.
    from glasspipe_job.arrow_parts import arrow_schema
    from glasspipe_job.jvm import arrow_batch_rdd

    conf = {"spark.sql.execution.arrow.maxRecordsPerBatch": str(max_records),
            "spark.sql.execution.arrow.useLargeVarTypes": str(large).lower()}
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        df = _columns_of_every_kind(spark, 5_003)
        schema = arrow_schema(df)
        assert pa_is_large(schema.field("s").type) is large
        ours = arrow_batch_rdd(df, large)
        assert ours is not None
        ours_count, ours_table = _read_batches(ours, schema)
        sparks_count, sparks_table = _read_batches(df._jdf.toArrowBatchRdd().toJavaRDD(), schema)
        # again: the tasks now write into the vectors the first tasks left, grown to their batches' size
        again_count, again_table = _read_batches(arrow_batch_rdd(df, large), schema)
    finally:
        for k, v in before.items():
            spark.conf.unset(k) if v is None else spark.conf.set(k, v)
    assert ours_table.num_rows == 5_003
    assert ours_count == sparks_count == again_count
    assert again_table.equals(ours_table)
    assert ours_table.column("s").null_count == 1_001
    for name in schema.names:
        assert ours_table.column(name).to_pylist() == sparks_table.column(name).to_pylist(), name
    assert ours_table.equals(sparks_table)


def pa_is_large(kind: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_large_string(kind))


def test_a_type_the_jar_does_not_fill_goes_through_sparks_writer(spark: Any) -> None:
    from glasspipe_job.arrow_parts import arrow_partitions
    from glasspipe_job.jvm import arrow_batch_rdd

    df = spark.range(0, 10, 1, 2).selectExpr("id", "array(id, id + 1) AS pair")
    assert arrow_batch_rdd(df, False) is None
    (table,) = arrow_partitions(df, one_part=True)
    assert table.column("pair").to_pylist() == [[i, i + 1] for i in range(10)]
