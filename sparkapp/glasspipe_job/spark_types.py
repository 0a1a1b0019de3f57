"""ClickHouse column types as the Spark types the job casts output columns to."""

from __future__ import annotations

from pyspark.sql import types as T

from glasspipe.api.validation import split_clickhouse_type

_BASE: dict[str, T.DataType] = {
    "String": T.StringType(), "FixedString": T.StringType(), "UUID": T.StringType(),
    "Int8": T.ByteType(), "Int16": T.ShortType(), "Int32": T.IntegerType(), "Int64": T.LongType(),
    "UInt8": T.ShortType(), "UInt16": T.IntegerType(), "UInt32": T.LongType(), "UInt64": T.DecimalType(20, 0),
    "Float32": T.FloatType(), "Float64": T.DoubleType(), "Bool": T.BooleanType(),
    "Date": T.DateType(), "DateTime": T.TimestampType(), "DateTime64": T.TimestampType(),
}


def spark_type_for_clickhouse(ch_type: str) -> T.DataType:
    base, _ = split_clickhouse_type(ch_type)
    if base == "Decimal":
        inner = ch_type[ch_type.index("Decimal(") + len("Decimal("):].split(")")[0]
        precision, scale = (int(x) for x in inner.split(","))
        return T.DecimalType(precision, scale)
    return _BASE[base]
