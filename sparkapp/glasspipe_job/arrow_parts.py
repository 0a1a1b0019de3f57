"""A micro-batch taken to the driver one Spark partition at a time, as Arrow (``df.toArrow()`` would gather the
whole batch in the driver's heap at once: the catch-up of a long backlog ran out of memory).

Each partition is one Spark job over the same RDD (``PythonRDD.runJob``): the stages before the last shuffle
run once, the last stage once per partition, so every row is computed once, as with a single collect. A
partition's content does not depend on the order tasks finish in: the same batch replayed gives the same
partitions with the same rows (the order of rows inside a partition may differ; the sink sorts them).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.serializers import NoOpSerializer
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.util import _load_from_socket


def arrow_schema(df: DataFrame) -> pa.Schema:
    large = df.sparkSession.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    return to_arrow_schema(df.schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC",
                           prefers_large_types=large)


def arrow_partitions(df: DataFrame) -> Iterator[pa.Table]:
    """The rows of ``df``, one Arrow table per Spark partition, in partition order; only the partition being
    read is held in the driver (plus what the caller keeps)."""
    spark = df.sparkSession
    sc = spark.sparkContext
    jvm = sc._jvm
    assert jvm is not None
    schema = arrow_schema(df)
    rdd = df._jdf.toArrowBatchRdd().toJavaRDD()  # serialized Arrow record batches, per partition
    for index in range(rdd.getNumPartitions()):
        sock = jvm.PythonRDD.runJob(sc._jsc.sc(), rdd, [index])
        with _load_from_socket(sock, NoOpSerializer()) as stream:
            batches = [pa.ipc.read_record_batch(pa.py_buffer(b), schema) for b in stream]
        yield pa.Table.from_batches(batches, schema=schema)
