"""native_block: ClickHouse's Native encoding of Arrow columns, against a byte-by-byte reference."""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Sequence

import pyarrow as pa
import pytest

from glasspipe_job.clickhouse.errors import SinkError
from glasspipe_job.clickhouse.native_block import encode_column, encode_constant_string


def leb128(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def reference_strings(values: Sequence[str | None]) -> bytes:
    return b"".join(leb128(len(v.encode())) + v.encode() for v in ("" if v is None else v for v in values))


STRINGS = ["", "a", "é" * 70, "x" * 127, "y" * 128, "z" * 16383, "w" * 16384, "v" * 2_100_000, "日本"]


def test_strings_of_every_varint_width_encode_as_length_then_bytes() -> None:
    assert encode_column("s", "String", pa.array(STRINGS)) == reference_strings(STRINGS)
    assert encode_column("s", "String", pa.array(STRINGS, pa.large_string())) == reference_strings(STRINGS)


def test_a_slice_and_a_chunked_array_encode_their_own_rows_only() -> None:
    arr = pa.array(STRINGS)
    assert encode_column("s", "String", arr.slice(3, 4)) == reference_strings(STRINGS[3:7])
    chunked = pa.chunked_array([arr.slice(0, 2), arr.slice(5, 3)])
    assert encode_column("s", "String", chunked) == reference_strings(STRINGS[:2] + STRINGS[5:8])


def test_nullable_columns_carry_a_null_map_then_defaults() -> None:
    got = encode_column("s", "Nullable(String)", pa.array(["ab", None, "c"]))
    assert got == bytes([0, 1, 0]) + reference_strings(["ab", "", "c"])
    got = encode_column("n", "Nullable(Int32)", pa.array([None, 7, -2], pa.int64()))
    assert got == bytes([1, 0, 0]) + struct.pack("<3i", 0, 7, -2)


def test_a_null_in_a_column_that_is_not_nullable_names_the_column() -> None:
    with pytest.raises(SinkError, match=r"column 'id' \(Int64\) got NULL \(first at row 1"):
        encode_column("id", "Int64", pa.array([1, None]))


def test_numbers_times_and_dates() -> None:
    assert encode_column("u", "UInt16", pa.array([0, 65535], pa.int64())) == struct.pack("<2H", 0, 65535)
    assert encode_column("f", "Float32", pa.array([1.5, -2.0])) == struct.pack("<2f", 1.5, -2.0)
    assert encode_column("b", "UInt8", pa.array([True, False])) == bytes([1, 0])
    ts = pa.array([dt.datetime(2024, 5, 1, 12, 0, 1, 999_999)], pa.timestamp("us", tz="UTC"))
    assert encode_column("t", "DateTime", ts) == struct.pack("<I", 1714564801)
    assert encode_column("t", "DateTime64(3)", ts) == struct.pack("<q", 1714564801999)
    assert encode_column("t", "DateTime64(9, 'UTC')", ts) == struct.pack("<q", 1714564801999999000)
    assert encode_column("d", "Date", pa.array([dt.date(2024, 5, 1)])) == struct.pack("<H", 19844)


def test_what_has_no_exact_encoding_is_left_to_the_driver() -> None:
    assert encode_column("u", "UInt8", pa.array([256])) is None  # out of range: the driver's error
    assert encode_column("i", "Int64", pa.array([1.5])) is None  # a float for an integer: the driver truncates
    assert encode_column("t", "DateTime", pa.array([dt.datetime(1960, 1, 1)], pa.timestamp("us"))) is None
    assert encode_column("s", "String", pa.array([1, 2])) is None  # a number as text: the driver's str()
    assert encode_column("s", "LowCardinality(String)", pa.array(["a"])) is None
    assert encode_column("d", "Decimal(18, 4)", pa.array([1], pa.int64())) is None
    assert encode_column("s", "FixedString(2)", pa.array(["ab"])) is None


def test_a_constant_string_column() -> None:
    assert encode_constant_string("w/1/0-3", 3) == reference_strings(["w/1/0-3"] * 3)
    assert encode_constant_string("m", 0) == b""
