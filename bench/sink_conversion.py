"""CPU cost of turning one collected micro-batch into the values clickhouse-driver sends: the list path
(``to_pylist`` of every column, a Python conversion per value, a Python sort when the batch spans several
chunks) against the Arrow path (numpy for timestamps, Arrow's sort) and the Native bytes the job sends now
(native_block.py: no Python value at all). No server needed; the batch has the sms-dedup pipeline's columns.
Checks the list and Arrow paths give the same values.

With ``--clickhouse`` it also starts the local ClickHouse server and writes the batch through the sink both ways
(Native bytes, and the driver's Python values), printing the driver process's CPU for each and checking the two
tables hold the same rows.

    python bench/sink_conversion.py --rows 183453 [--clickhouse]
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import time

import pyarrow as pa

from glasspipe_job.clickhouse.native_block import encode_column
from glasspipe_job.clickhouse.values import (
    canonical_order,
    canonical_order_arrow,
    convert_arrow_column,
    convert_column,
)

TYPES = {"sms_id": "String", "status": "Nullable(String)", "phone": "Nullable(String)",
         "provider": "Nullable(String)", "sent_at": "DateTime64(3)", "seq": "Nullable(Int64)"}


def batch(n: int) -> pa.Table:
    rng = random.Random(1)
    base = dt.datetime(2026, 11, 23, 8, 0)
    t = pa.table({
        "sms_id": [f"s-7-{i:09d}" for i in range(n)], "status": ["first"] * n,
        "phone": [f"+1555{rng.randrange(10**7):07d}" for _ in range(n)],
        "provider": [rng.choice(("twilio", "vonage", "sinch")) for _ in range(n)],
        "sent_at": pa.array([base + dt.timedelta(microseconds=100 * i) for i in range(n)], pa.timestamp("us", "UTC")),
        "seq": list(range(n)),
    })
    return t.take(list(reversed(range(n))))  # not in canonical order


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=183_453)
    p.add_argument("--clickhouse", action="store_true", help="also write it through the sink to a local server")
    p.add_argument("--max-rows", type=int, default=100_000, help="the sink's chunk size (batching.maxRows)")
    args = p.parse_args()
    t = batch(args.rows)
    start = time.process_time()
    for c in TYPES:
        assert encode_column(c, TYPES[c], t.column(c)) is not None
    print(f"{args.rows} rows, one chunk: Native bytes {time.process_time() - start:.3f} CPU-s", flush=True)
    for ordered in (False, True):
        start = time.process_time()
        raw = [t.column(c).to_pylist() for c in TYPES]
        if ordered:
            order = canonical_order(raw)
            raw = [[col[i] for i in order] for col in raw]
        old = [convert_column(c, TYPES[c], col) for c, col in zip(TYPES, raw, strict=True)]
        list_s = time.process_time() - start
        start = time.process_time()
        arrow = t.select(list(TYPES))
        if ordered:
            order_a = canonical_order_arrow(arrow)
            assert order_a is not None
            arrow = arrow.take(order_a)
        new = [convert_arrow_column(c, TYPES[c], arrow.column(c)) for c in TYPES]
        arrow_s = time.process_time() - start
        assert old == new
        print(f"{args.rows} rows, {'several chunks (sorted)' if ordered else 'one chunk'}: list path "
              f"{list_s:.2f} CPU-s, Arrow path {arrow_s:.2f} CPU-s ({list_s / arrow_s:.0f}x)", flush=True)
    if args.clickhouse:
        through_sink(t, args.max_rows)


def through_sink(t: pa.Table, max_rows: int, repeats: int = 5) -> None:
    """The batch written ``repeats`` times through the sink, Native bytes against the driver's values: the CPU of
    this process (conversion, encoding, the driver's serialisation) per million rows, and the same rows stored."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
    from glasspipe.api.validation import OutputColumn
    from glasspipe_dev.clickhouse import ClickHouseServer
    from glasspipe_dev.sinks import sink_from_settings

    # the job's table: a timestamp field is a DateTime (this ClickHouse, 18.16, has no DateTime64)
    cols = [OutputColumn(c, f"`{c}`", "DateTime" if ty.startswith("DateTime64") else ty, None)
            for c, ty in TYPES.items()]
    server = ClickHouseServer()
    server.start()
    try:
        stored = []
        for native in (True, False):
            table = f"conversion_{'native' if native else 'driver'}"
            with sink_from_settings([f"127.0.0.1:{server.port}"], "default", table, cols, f"default.{table}-0",
                                max_rows=max_rows, create_table=True, order_by=["sms_id"]) as sink:
                sink._native = native
                start, wall = time.process_time(), time.monotonic()
                for b in range(repeats):
                    res = sink.write_batch(b, t, "o")
                    assert res.native_chunks == (res.chunks if native else 0)
                cpu, wall = time.process_time() - start, time.monotonic() - wall
            rows = repeats * t.num_rows
            print(f"through the sink, {rows} rows in chunks of {max_rows}: "
                  f"{'Native bytes' if native else 'driver values'} {cpu:.2f} CPU-s of this process "
                  f"({cpu / rows * 1e6:.2f} CPU-us a row), {wall:.2f} s", flush=True)
            stored.append(server.client().execute(f"SELECT groupBitXor(cityHash64(*)), count() FROM "
                                                  f"(SELECT {', '.join(TYPES)} FROM {table})"))
        assert stored[0] == stored[1], stored
        print(f"both tables hold the same {stored[0][0][1]} rows", flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()
