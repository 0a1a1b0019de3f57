"""Python values in the form clickhouse-driver writes correctly for a column's ClickHouse type.

Values arrive as pyarrow's ``to_pylist()`` gives them (Spark runs with session time zone UTC), or as
Arrow arrays (``convert_arrow_column``: timestamps become the driver's integers in one vectorised step
instead of a datetime object per row); the table's own column types decide the conversion, so a table
that differs from the spec still gets what it can store, or a SinkError naming the column and the value.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from glasspipe.api.validation import parse_clickhouse_type
from glasspipe_job.clickhouse.errors import SinkError

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_US = dt.timedelta(microseconds=1)
_ONE_S = dt.timedelta(seconds=1)

Converter = Callable[[Any], Any]


def _as_utc(v: dt.datetime) -> dt.datetime:
    """Spark runs with session time zone UTC: naive timestamps from to_pylist() are UTC wall-clock."""
    return v.replace(tzinfo=dt.UTC) if v.tzinfo is None else v


def _epoch_micros(v: Any) -> int:
    if isinstance(v, dt.datetime):
        return (_as_utc(v) - _EPOCH) // _ONE_US
    if isinstance(v, dt.date):
        return (dt.datetime(v.year, v.month, v.day, tzinfo=dt.UTC) - _EPOCH) // _ONE_US
    if isinstance(v, str):
        return _epoch_micros(dt.datetime.fromisoformat(v))
    if isinstance(v, int | float | Decimal):
        return int(v * 1_000_000)  # numbers are epoch seconds
    raise TypeError(f"cannot convert {type(v).__name__} {v!r} to a timestamp")


def _to_datetime(v: Any) -> int:
    # Epoch seconds: the driver would read a naive datetime in the CLIENT's local zone, an int as-is.
    if isinstance(v, dt.datetime):
        return int((v if v.tzinfo is not None else v.replace(tzinfo=dt.UTC)).timestamp())  # C-fast path
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    return _epoch_micros(v) // 1_000_000


def _datetime64(scale: int) -> Converter:
    def conv(v: Any) -> int:
        us = _epoch_micros(v)
        return us * 10 ** (scale - 6) if scale >= 6 else us // 10 ** (6 - scale)

    return conv


def _to_date(v: Any) -> dt.date:
    if isinstance(v, dt.datetime):
        return _as_utc(v).astimezone(dt.UTC).date()
    if isinstance(v, dt.date):
        return v
    if isinstance(v, str):
        return dt.date.fromisoformat(v[:10])
    raise TypeError(f"cannot convert {type(v).__name__} {v!r} to a date")


def _to_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dt.datetime):
        u = _as_utc(v).astimezone(dt.UTC)
        return u.strftime("%Y-%m-%d %H:%M:%S") + (f".{u.microsecond:06d}" if u.microsecond else "")
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, Decimal):
        return format(v, "f")
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def _to_int(v: Any) -> int:
    if isinstance(v, int):
        return int(v)  # bool -> 0/1
    if isinstance(v, float) and not math.isfinite(v):
        raise TypeError(f"{v} has no integer value")
    if isinstance(v, str):
        return int(v.strip())
    return int(v)


def _to_float(v: Any) -> float:
    return float(v)


def _to_bool(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "t", "yes")
    return bool(v)


def _to_decimal(v: Any) -> Any:
    if isinstance(v, Decimal | int) and not isinstance(v, bool):
        return v
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        return Decimal(repr(v))
    return Decimal(str(v))


def _to_uuid(v: Any) -> str:
    return str(v)


def converter_for(ch_type: str) -> tuple[Converter | None, frozenset[type]]:
    """The per-value conversion for a ClickHouse column type (None: values pass as they are), and the
    Python types the driver writes correctly as they are (a column of only those is just copied)."""
    parsed = parse_clickhouse_type(ch_type)
    inner, base = parsed.inner, parsed.base
    if base in ("String", "FixedString"):
        return _to_str, frozenset({str})
    if re.fullmatch(r"U?Int(8|16|32|64|128|256)", base):
        return _to_int, frozenset({int})  # type(True) is bool: booleans are converted
    if base in ("Float32", "Float64"):
        return _to_float, frozenset({float})
    if base == "Bool":
        return _to_bool, frozenset({bool})
    if base == "Date" or base == "Date32":
        return _to_date, frozenset({dt.date})
    if base == "DateTime":
        return _to_datetime, frozenset({int})
    if base == "DateTime64":
        m = re.match(r"DateTime64\(\s*(\d+)", inner)
        return _datetime64(int(m.group(1)) if m else 3), frozenset()
    if base.startswith("Decimal"):
        return _to_decimal, frozenset({Decimal, int})
    if base == "UUID":
        return _to_uuid, frozenset({str})
    return None, frozenset()  # Array, Map, Enum...: what Spark gives is what the driver takes


def convert_column(name: str, ch_type: str, values: Sequence[Any]) -> list[Any]:
    """A new list with every value in the form clickhouse-driver writes correctly for ch_type."""
    nullable = parse_clickhouse_type(ch_type).nullable
    conv, native = converter_for(ch_type)
    if not nullable and None in values:
        for i, v in enumerate(values):
            if v is None:
                raise SinkError(
                    f"column {name!r} ({ch_type}) got NULL (first at row {i} of the batch); declare the "
                    f"column Nullable({ch_type}) in the spec and the table, or make the field non-nullable "
                    "(records without it then go to the dead-letter topic)"
                )
    if conv is None or set(map(type, values)) - {type(None)} <= native:
        return list(values)
    try:
        return [None if v is None else conv(v) for v in values]
    except (TypeError, ValueError, ArithmeticError) as e:
        bad = next((v for v in values if v is not None and not _converts(conv, v)), None)
        raise SinkError(
            f"column {name!r} ({ch_type}): cannot convert value {bad!r} ({type(bad).__name__}): {e}; "
            "fix the column's type or its expression"
        ) from e


def null_error(name: str, ch_type: str, values: pa.Array | pa.ChunkedArray) -> SinkError:
    first = int(pc.index(pc.is_null(values), True).as_py())
    return SinkError(
        f"column {name!r} ({ch_type}) got NULL (first at row {first} of the batch); declare the "
        f"column Nullable({ch_type}) in the spec and the table, or make the field non-nullable "
        "(records without it then go to the dead-letter topic)"
    )


def timestamp_ticks(values: pa.Array | pa.ChunkedArray, ch_type: str) -> np.ndarray | None:
    """Epoch ticks (int64) of a DateTime / DateTime64(s) column straight from an Arrow timestamp array, NULLs as
    0 (None: no fast path for this pair of types). Arrow timestamps count from the epoch in UTC whatever their
    zone."""
    parsed = parse_clickhouse_type(ch_type)
    if not pa.types.is_timestamp(values.type) or parsed.base not in ("DateTime", "DateTime64"):
        return None
    unit_per_s = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[values.type.unit]
    if parsed.base == "DateTime":
        scale_per_s = 1
    else:
        m = re.match(r"DateTime64\(\s*(\d+)", parsed.inner)
        scale_per_s = 10 ** (int(m.group(1)) if m else 3)
    raw = pc.fill_null(values.cast(pa.int64()), 0)
    ticks = np.asarray(raw.to_numpy(zero_copy_only=False), dtype=np.int64)
    if scale_per_s >= unit_per_s:
        return ticks * (scale_per_s // unit_per_s)
    step = unit_per_s // scale_per_s
    quotient = np.floor_divide(ticks, step)
    if parsed.base == "DateTime":  # int(datetime.timestamp()) truncates towards zero (before 1970)
        quotient += (ticks < 0) & (ticks % step != 0)
    return quotient


def _timestamp_ticks(values: pa.Array | pa.ChunkedArray, ch_type: str) -> list[Any] | None:
    """``timestamp_ticks`` as the driver's list, NULLs as None."""
    ticks = timestamp_ticks(values, ch_type)
    if ticks is None:
        return None
    out: list[Any] = ticks.tolist()
    if values.null_count:
        for i in np.flatnonzero(pc.is_null(values).to_numpy(zero_copy_only=False)).tolist():
            out[i] = None
    return out


def convert_arrow_column(name: str, ch_type: str, values: pa.Array | pa.ChunkedArray) -> list[Any]:
    """``convert_column`` for an Arrow array: the same values, timestamps converted without Python objects."""
    if values.null_count and not parse_clickhouse_type(ch_type).nullable:
        raise null_error(name, ch_type, values)
    fast = _timestamp_ticks(values, ch_type)
    return fast if fast is not None else convert_column(name, ch_type, values.to_pylist())


def canonical_order_arrow(table: pa.Table) -> list[int] | None:
    """``canonical_order`` computed by Arrow (the same order: values ascending, NaN after numbers, NULL
    last); None when a column's type cannot be sorted by Arrow (lists, maps): use canonical_order."""
    try:
        if int(pa.__version__.split(".")[0]) >= 25:  # null placement per key since 25; the option before
            idx = pc.sort_indices(table, sort_keys=[(c, "ascending", "at_end") for c in table.column_names])
        else:
            idx = pc.sort_indices(table, sort_keys=[(c, "ascending") for c in table.column_names],
                                  null_placement="at_end")
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    order: list[int] = idx.to_pylist()
    return order


def _converts(conv: Converter, v: Any) -> bool:
    try:
        conv(v)
        return True
    except Exception:
        return False


def canonical_order(columns: Sequence[Sequence[Any]]) -> list[int]:
    """Row indices sorted by the rows' values: chunk k holds the same rows however Spark ordered a replay.

    Only needed when a batch spans several chunks. None sorts last and NaN after numbers, so the order
    is total (a NaN compares unequal to everything and would make sorted() order-dependent).
    """
    keycols: list[Sequence[Any]] = []
    for col in columns:
        has_none = any(v is None for v in col)
        has_nan = any(isinstance(v, float) and v != v for v in col)
        if has_none or has_nan:
            keycols.append([(2, 0) if v is None else (1, 0) if v != v else (0, v) for v in col])
        else:
            keycols.append(col)
    n = len(columns[0]) if columns else 0
    if not keycols:
        return list(range(n))
    keys = list(zip(*keycols, strict=True))
    return sorted(range(n), key=keys.__getitem__)
