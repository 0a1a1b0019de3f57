"""Throughput of the exactly-once ClickHouse sink (marker mechanism) on the local ClickHouse 18.16.

Run: $GLASSPIPE_CACHE/venv/bin/python bench/clickhouse_sink.py [--batches 10] [--rows 100000]
It starts its own throw-away server, writes ``--batches`` micro-batches of ``--rows`` rows (5 columns:
a typical pipeline row) through ClickHouseSink.write_batch and prints rows/s, split into value
conversion and the rest (INSERT + ledger), next to a bare clickhouse-driver columnar INSERT of the
same rows for comparison.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for sub in ("dev", "operator", "sparkapp"):
    sys.path.insert(0, str(ROOT / sub))

from glasspipe.api.validation import OutputColumn  # noqa: E402
from glasspipe_dev.clickhouse import ClickHouseServer  # noqa: E402
from glasspipe_dev.sinks import sink_from_settings  # noqa: E402
from glasspipe_job.clickhouse import sink as clickhouse_sink  # noqa: E402
from glasspipe_job.clickhouse.values import convert_column  # noqa: E402

COLS = [
    OutputColumn("id", "`id`", "Int64", None),
    OutputColumn("key", "`key`", "String", None),
    OutputColumn("ts", "`ts`", "DateTime", None),
    OutputColumn("v", "`v`", "Nullable(Float64)", None),
    OutputColumn("src", "`src`", "UInt32", None),
]
T0 = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)


def batch(b: int, n: int) -> dict[str, list[Any]]:
    """Values as pyarrow's to_pylist() gives them for a Spark row (tz-aware UTC timestamps)."""
    ids = list(range(b * n, (b + 1) * n))
    return {
        "id": ids,
        "key": [f"key-{i % 5000}" for i in ids],
        "ts": [T0 + dt.timedelta(seconds=i % 86400) for i in ids],
        "v": [None if i % 10 == 0 else i * 0.5 for i in ids],
        "src": [7] * n,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--max-rows", type=int, default=100_000, help="rows per INSERT (chunk)")
    args = ap.parse_args()
    data = [batch(b, args.rows) for b in range(args.batches)]
    with ClickHouseServer() as server:
        print(
            f"ClickHouse {'.'.join(map(str, server.version()))}, "
            f"{args.batches} batches x {args.rows:,} rows, "
            f"chunks of {args.max_rows:,} rows"
        )
        sink = sink_from_settings(
            [f"127.0.0.1:{server.port}"],
            "default",
            "bench",
            COLS,
            "bench-0",
            max_rows=args.max_rows,
            create_table=True,
            order_by=["key", "id"],
        ).open()
        print(f"mechanism: {sink.mechanism.value if sink.mechanism else '?'}")

        t = time.monotonic()
        for c in COLS:
            for d in data:
                convert_column(c.name, c.clickhouse_type, d[c.name])
        conv = time.monotonic() - t

        t = time.monotonic()
        for b, d in enumerate(data):
            res = sink.write_batch(b, d, f"offsets-{b}")
            assert res.rows_written == args.rows, res
        total = time.monotonic() - t
        n = args.batches * args.rows
        print(
            f"write_batch: {n / total:,.0f} rows/s ({total / args.batches * 1000:.0f} ms per batch; "
            f"of which value conversion {conv / args.batches * 1000:.0f} ms)"
        )

        t = time.monotonic()
        for d in data:
            sink.write_batch(0, d, "offsets-0")  # replays: one ledger lookup each
        print(f"replayed batch (skipped): {(time.monotonic() - t) / args.batches * 1000:.1f} ms")

        # a fresh sink looks up chunks of a crashed predecessor before its first batch
        fresh = sink_from_settings(
            [f"127.0.0.1:{server.port}"], "default", "bench", COLS, "bench-1", max_rows=args.max_rows
        ).open()
        t = time.monotonic()
        fresh.chunks_present(0)
        print(f"chunk presence lookup over {n:,} rows: {(time.monotonic() - t) * 1000:.1f} ms")

        client = server.client()
        client.execute("CREATE TABLE raw AS bench")
        raw = [[convert_column(c.name, c.clickhouse_type, d[c.name]) for c in COLS] for d in data]
        t = time.monotonic()
        for cols in raw:
            client.execute("INSERT INTO raw (id, key, ts, v, src) VALUES", cols, columnar=True)
        bare = time.monotonic() - t
        print(f"bare driver INSERT of pre-converted columns: {n / bare:,.0f} rows/s")
        got = client.execute("SELECT count(), uniqExact(id) FROM bench")[0]
        assert got == (n, n), got
        print(f"rows in table: {got[0]:,} (each once); module {clickhouse_sink.__name__}")


if __name__ == "__main__":
    main()
