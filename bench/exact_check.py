"""Whether a benchmark's table holds exactly what it should (bench/freshness.py, bench/restart.py): each key's first
occurrence once and no two rows of a key within a window, or without deduplication every event once. Counted in
buckets, so that 20 M rows fit the local server's memory."""

from __future__ import annotations

import sys
from pathlib import Path

from clickhouse_driver import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from glasspipe.api.durations import parse_duration_ms
from glasspipe_dev.clickhouse import ClickHouseServer

ROWS_PER_CHECK = 3_000_000  # rows of the sink's table a bucket of check_exact holds, about


def check_exact(ch: ClickHouseServer, table: str, firsts: int, window: str) -> tuple[bool, int, int, int, int]:
    """(exact, rows, keys, reopened, too close): exact when every first occurrence landed once (by ``seq``) and no
    key has two rows less than a deduplication window apart. A repeat produced a window or more after its key's first
    row opens a new window (docs/semantics.md) and lands: ``reopened`` counts those rows. A run longer than
    the window has some: the tail of repeats reaches ``max_repeat_delay_s``, and the wait between the warm-up
    and the measured stream adds to their delay."""
    w = parse_duration_ms(window)
    client = ch.client()
    [(rows,)] = client.execute(f"SELECT count() FROM {table}")
    # in key buckets: the local server allows 2 GiB in all, less than a GROUP BY of 15 M keys takes
    n = rows // ROWS_PER_CHECK + 1
    keys = too_close = 0
    for i in range(n):
        [(k, tc)] = client.execute(
            f"SELECT count(), countIf(c > 1 AND span < (c - 1) * {w}) FROM (SELECT sms_id, count() AS c, "
            f"max(sent_ms) - min(sent_ms) AS span FROM {table} WHERE cityHash64(sms_id) % {n} = {i} GROUP BY sms_id)")
        keys, too_close = keys + k, too_close + tc
    with_seq, seqs = seq_counts(client, table, n)
    exact = keys == firsts == with_seq == seqs and too_close == 0
    return exact, rows, keys, rows - with_seq, too_close


def seq_counts(client: Client, table: str, buckets: int) -> tuple[int, int]:
    """(rows with a seq, distinct seqs) of ``table``, counted in ``buckets`` buckets of seq (memory: see
    ROWS_PER_CHECK); first occurrences carry seq > 0, repeats -1."""
    with_seq = seqs = 0
    for i in range(buckets):
        [(a, b)] = client.execute(
            f"SELECT count(), uniqExact(seq) FROM {table} WHERE seq > 0 AND seq % {buckets} = {i}")
        with_seq, seqs = with_seq + a, seqs + b
    return with_seq, seqs


def check_every_event(ch: ClickHouseServer, table: str, events: int, firsts: int) -> tuple[bool, int, int]:
    """(exact, rows, distinct first occurrences) without deduplication: exact when every event landed once, i.e.
    ``events`` rows of which ``firsts`` carry a distinct seq (a repeat's seq is -1)."""
    client = ch.client()
    [(rows,)] = client.execute(f"SELECT count() FROM {table}")
    with_seq, seqs = seq_counts(client, table, rows // ROWS_PER_CHECK + 1)
    return rows == events and with_seq == seqs == firsts, rows, seqs
