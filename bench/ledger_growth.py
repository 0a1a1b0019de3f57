"""What the ledger costs a running pipeline as it grows: the per-batch fence check and a replica start's read.

The ledger gains two rows per micro-batch and the job never prunes it (~170 000 rows a day at a 1 s
trigger). Starts its own ClickHouse, fills one pipeline's ledger with 3 writers' pending/done rows up to
each size, and times, with the job's own code:

- the fence check a writer runs several times per batch (``Fence.check``: the claims key), and the scan of
  every claimed row of the pipeline that it replaced (``Ledger.pipeline_rows(state='claimed')``);
- a replica start's ledger read and decisions (``Ledger.handover_rows``, ``handover.new_start``,
  ``next_generation``), and, up to ``--every-max`` rows, the same decisions from every row of the
  pipeline (``pipeline_rows``), the earlier read (its memory grows with the ledger: ~0.6 GB at 1 M rows).

    python bench/ledger_growth.py --sizes 10000,1000000,10000000
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))

from arg_types import comma_separated

from glasspipe.api.validation import OutputColumn
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_job import handover as ho
from glasspipe_job.clickhouse.connection import Connection
from glasspipe_job.clickhouse.ledger import CLAIMED, Fence, Ledger, next_generation
from glasspipe_job.clickhouse.table import ClickHouseTable

PREFIX = "glasspipe.default.orders."
TOPIC = "orders"


def median_ms(fn: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def decide(rows: list[Any]) -> None:
    """What prepare_handover decides from the rows (a new start; resumable's read is ledger_progress too)."""
    ho.new_start("x", rows, {TOPIC: {0: 0, 1: 0, 2: 0}}, {}, {TOPIC: 0}, {})
    next_generation(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=comma_separated(int, least=0), default=[10_000, 1_000_000, 10_000_000],
                        help="ledger rows to measure at")
    parser.add_argument("--every-max", type=int, default=1_000_000,
                        help="largest ledger to also read whole (the earlier start-up read)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gp-ledger-") as tmp, ClickHouseServer(Path(tmp) / "ch") as ch:
        table = ClickHouseTable(Connection([f"127.0.0.1:{ch.port}"], "default"), "orders",
                                [OutputColumn("id", "`id`", "String", "s.id")], create_table=True, order_by=["id"])
        table.open()
        ledger = Ledger(table)
        for w in range(3):
            ledger.claim(PREFIX, f"{PREFIX}{w}of3-abc123", 1, f'[{{"{TOPIC}": {{"{w}": 0}}}}]', {TOPIC: 3})
        fence = Fence(ledger, PREFIX, f"{PREFIX}0of3-abc123", 1, frozenset({(TOPIC, 0)}))
        client = ch.client()
        total = 0
        print("ledger rows | fence check (claims key) | scan of every claim (before) | replica start: read + "
              "decisions | rows read | from every row (before) | max RSS so far")
        for target in args.sizes:
            first_batch = total // 6
            client.execute(
                f"INSERT INTO {table.ledger_table} (writer, batch_id, chunks, rows, offsets, state) SELECT "
                f"concat('{PREFIX}', toString(number % 3), 'of3-abc123'), intDiv(number, 6) + {first_batch}, 1, "
                f"1000, concat('[{{\"{TOPIC}\": {{\"', toString(number % 3), '\": ', "
                f"toString(intDiv(number, 6) + {first_batch}), '}}}}]'), if(number % 2 = 0, 'pending', 'done') "
                f"FROM numbers({target - total})")
            total = target
            client.execute(f"OPTIMIZE TABLE {table.ledger_table} FINAL")
            fence_ms = median_ms(fence.check, 7)
            scan_ms = median_ms(lambda: ledger.pipeline_rows(PREFIX, state=CLAIMED), 5)
            rows = ledger.handover_rows(PREFIX)
            start_ms = median_ms(lambda: decide(ledger.handover_rows(PREFIX)), 3)
            every = "not run"
            if total <= args.every_max:
                every = f"{median_ms(lambda: decide(ledger.pipeline_rows(PREFIX)), 1):,.0f} ms"
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"{total:>11,} | {fence_ms:.1f} ms | {scan_ms:.1f} ms | {start_ms:,.0f} ms | {len(rows)} | "
                  f"{every} | {rss:,.0f} MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
