"""CPU cost of turning one collected micro-batch into the values clickhouse-driver sends: the list path
(``to_pylist`` of every column, a Python conversion per value, a Python sort when the batch spans several
chunks) against the Arrow path the job uses (numpy for timestamps, Arrow's sort). No server needed; the
batch has the sms-dedup pipeline's columns. Checks both give the same values.

    python bench/sink_conversion.py --rows 183453
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import time

import pyarrow as pa

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
    args = p.parse_args()
    t = batch(args.rows)
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


if __name__ == "__main__":
    main()
