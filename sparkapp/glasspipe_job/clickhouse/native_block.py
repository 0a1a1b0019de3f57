"""A chunk's columns in ClickHouse's Native format, encoded from Arrow buffers with numpy: no Python object per
value. The driver's path (``values.convert_arrow_column``, then clickhouse-driver writing Python lists) was
two thirds of the driver's CPU at 100 000 events/s (docs/benchmarks-journal.md).

Pure: bytes in, bytes out. ``encode_column`` returns None for a pair of types it has no exact encoding for, or
values it cannot encode exactly (an integer out of the column's range, a float that is not a whole number for an
integer column...); the chunk then goes the driver's way, with its conversions and its errors, as before.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from glasspipe.api.validation import parse_clickhouse_type
from glasspipe_job.clickhouse.values import null_error, timestamp_ticks

_FIXED: dict[str, tuple[str, pa.DataType]] = {  # fixed-width types: numpy's little-endian dtype, Arrow's type
    "Int8": ("<i1", pa.int8()), "Int16": ("<i2", pa.int16()), "Int32": ("<i4", pa.int32()),
    "Int64": ("<i8", pa.int64()), "UInt8": ("<u1", pa.uint8()), "UInt16": ("<u2", pa.uint16()),
    "UInt32": ("<u4", pa.uint32()), "UInt64": ("<u8", pa.uint64()), "Float32": ("<f4", pa.float32()),
    "Float64": ("<f8", pa.float64()), "Bool": ("<u1", pa.uint8()),
}
_UINT32_END = 1 << 32
_DATE_DAYS_END = 1 << 16  # Date: days since 1970-01-01 as UInt16


def encode_column(name: str, ch_type: str, values: pa.Array | pa.ChunkedArray) -> bytes | None:
    """The Native encoding of ``values`` for a column of ``ch_type`` (None: no exact encoding here). A NULL in
    a column that is not Nullable raises the sink's error, as ``convert_arrow_column`` does."""
    parsed = parse_clickhouse_type(ch_type)
    if parsed.low_cardinality:
        return None
    array = _one_array(values)
    if array.null_count and not parsed.nullable:
        raise null_error(name, ch_type, array)
    body = _encode_values(parsed.base, ch_type, array)
    if body is None or not parsed.nullable:
        return body
    nulls = np.asarray(pc.is_null(array).to_numpy(zero_copy_only=False), dtype=np.uint8)
    return nulls.tobytes() + body  # Nullable(T): the null map, then T's values (NULLs as T's default)


def encode_constant_string(value: str, rows: int) -> bytes:
    """A String column of ``rows`` copies of ``value`` (the chunk's marker)."""
    raw = value.encode()
    return (_varint(len(raw)) + raw) * rows


def _one_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    return values


def _encode_values(base: str, ch_type: str, array: pa.Array) -> bytes | None:
    kind = array.type
    if base == "String":
        return _strings(array) if pa.types.is_string(kind) or pa.types.is_large_string(kind) else None
    if base in ("DateTime", "DateTime64"):
        ticks = timestamp_ticks(array, ch_type)
        if ticks is None:
            return None
        if base == "DateTime":  # UInt32 seconds
            if ticks.size and (int(ticks.min()) < 0 or int(ticks.max()) >= _UINT32_END):
                return None
            return ticks.astype("<u4").tobytes()
        return ticks.astype("<i8").tobytes()
    if base == "Date":
        if not pa.types.is_date32(kind):
            return None
        days = np.asarray(pc.fill_null(array, 0).cast(pa.int32()).to_numpy(zero_copy_only=False))
        if days.size and (int(days.min()) < 0 or int(days.max()) >= _DATE_DAYS_END):
            return None
        return days.astype("<u2").tobytes()
    fixed = _FIXED.get(base)
    if fixed is None:
        return None
    dtype, arrow_target = fixed
    if base == "Bool" and not pa.types.is_boolean(kind):
        return None
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
        return None
    if pa.types.is_floating(kind) and not pa.types.is_floating(arrow_target):
        return None  # the driver's int() truncates a float: its way, with its checks
    try:  # safe: an integer out of the column's range is not encoded (the driver's way reports it)
        cast = pc.cast(pc.fill_null(array, pa.scalar(0, kind)) if array.null_count else array, arrow_target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return np.asarray(cast.to_numpy(zero_copy_only=False)).astype(dtype, copy=False).tobytes()


def _strings(array: pa.Array) -> bytes:
    """String: each value's byte length as an unsigned LEB128 varint, then its bytes."""
    if array.null_count:
        array = pc.fill_null(array, "")
    n = len(array)
    if n == 0:
        return b""
    offset_type = np.int64 if pa.types.is_large_string(array.type) else np.int32
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=offset_type)[array.offset:array.offset + n + 1].astype(np.int64)
    lengths = np.diff(offsets)
    data = (np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0]:offsets[-1]] if data_buffer is not None
            else np.zeros(0, dtype=np.uint8))
    sizes = np.ones(n, dtype=np.int64)  # bytes of each length's varint
    rest = lengths >> 7
    while rest.any():
        sizes += rest > 0
        rest >>= 7
    ends = np.cumsum(sizes + lengths)
    starts = ends - sizes - lengths
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    is_payload = np.ones(out.size, dtype=bool)
    for k in range(int(sizes.max())):
        rows = np.flatnonzero(sizes > k) if k else slice(None)
        at = starts[rows] + k
        more = (sizes[rows] > k + 1).astype(np.int64) << 7
        out[at] = ((lengths[rows] >> (7 * k)) & 0x7F) | more
        is_payload[at] = False
    out[is_payload] = data
    return out.tobytes()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)
