"""Seeing a benchmark's rows land in ClickHouse, and the latency figures of them: a poller that notes when each
first occurrence (by ``seq``) was first seen, and the percentiles, by minute and by fifth of a run, that
bench/freshness.py prints and stores. Kept apart from freshness.py's launching of pipelines, so that
bench/restart.py and the unit tests use it alone."""

from __future__ import annotations

import threading
import time

import numpy as np

from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.process import ServerProcess

POLL_S = 0.05  # until 2026-11-25 evening 0.1: every latency read 0-100 ms long (50 ms on average)


class Poller(threading.Thread):
    """Sees rows land: latency of each first occurrence = first poll that saw it - its sent_ms. Columnar
    reads and numpy bookkeeping: at 40 000 rows/s a poller of Python rows took a fifth of a core."""

    def __init__(self, ch: ClickHouseServer, table: str, every: float = POLL_S) -> None:
        super().__init__(daemon=True)
        self.client, self.table, self.every = ch.client(), table, every
        self.low = 0  # every seq <= low has been seen
        self.seen = np.zeros(1 << 20, dtype=bool)  # by seq; grows
        self.latencies: list[np.ndarray] = []
        self.sent: list[np.ndarray] = []  # sent_ms / 1000 of each latency, to see whether latency grew over the run
        self.rows = 0
        self.cpu = 0.0  # this thread's CPU seconds so far, as of its last poll
        self.stop = threading.Event()

    def values(self, since: float) -> tuple[np.ndarray, np.ndarray]:
        """(latency, sent) in seconds of every row seen that was sent at ``since`` or later (the warm-up's rows,
        even one that lands late, are not measured)."""
        lat = np.concatenate(self.latencies) if self.latencies else np.zeros(0)
        sent = np.concatenate(self.sent) if self.sent else np.zeros(0)
        measured = sent >= since - 0.001  # sent_ms is whole milliseconds
        return lat[measured], sent[measured]

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.time()
            try:
                got = self.client.execute(f"SELECT seq, sent_ms FROM {self.table} WHERE seq > {self.low}",
                                          columnar=True)
            except Exception:  # the table appears with the first batch
                got = []
            seen = time.time()
            if got:
                self._saw(np.asarray(got[0], dtype=np.int64), np.asarray(got[1], dtype=np.float64) / 1000, seen)
            self.cpu = time.thread_time()
            time.sleep(max(0.0, self.every - (time.time() - started)))

    def _saw(self, seqs: np.ndarray, sent: np.ndarray, at: float) -> None:
        top = int(seqs.max())
        if top >= len(self.seen):
            self.seen = np.concatenate([self.seen, np.zeros(max(top + 1, 2 * len(self.seen)) - len(self.seen),
                                                            dtype=bool)])
        seqs, first = np.unique(seqs, return_index=True)  # a seq stored twice counts once (exact says the rest)
        new = ~self.seen[seqs]
        if new.any():
            self.seen[seqs[new]] = True
            self.rows += int(new.sum())
            self.latencies.append(at - sent[first][new])
            self.sent.append(sent[first][new])
        self.low = first_gap(self.seen, self.low)


def first_gap(seen: np.ndarray, low: int, chunk: int = 1 << 16) -> int:
    """The seq before the first one not seen after ``low`` (or the array's last): scanned a chunk at a time from
    ``low``, so a poll costs what it advances. Scanning the whole rest of the array each poll (``flatnonzero``) took
    97 ms of CPU a landed part at 20 M rows, more the further behind the pipeline was: the harness took 0.06-0.12
    cores more at 100 000/s (docs/benchmarks-journal.md, 2026-12-02 midday)."""
    while True:
        part = seen[low + 1:low + 1 + chunk]
        if not len(part):
            return low
        i = int(np.argmin(part))  # the first False, or 0 if there is none
        if not part[i]:
            return low + i
        low += len(part)


def quantile(values: np.ndarray, q: float) -> float:
    """summary_stats.percentile's value (rank ``q``, nearest from below) of an array, without sorting it as Python
    floats: a list of the 90 M latencies of a half-hour soak at 50 000/s would hold 2.9 GB."""
    if not len(values):
        return float("nan")
    rank = min(len(values) - 1, int(q * len(values)))
    return float(np.partition(values, rank)[rank])


def by_minute(sent: np.ndarray, latencies: np.ndarray) -> dict[int, tuple[float, float, float]]:
    """p50 / p95 / p99 latency of the rows produced in each minute of the measured window."""
    if not len(sent):
        return {}
    minutes = ((sent - sent.min()) // 60).astype(np.int64)
    groups = {int(m): latencies[minutes == m] for m in np.unique(minutes)}
    return {m: (quantile(v, 0.5), quantile(v, 0.95), quantile(v, 0.99)) for m, v in groups.items()}


def wait_for_rows(poller: Poller, rows: int, jobs: list[ServerProcess], timeout: float, when: str) -> None:
    """Until the poller has seen ``rows`` first occurrences or ``timeout`` seconds passed. A job (a replica) that exits
    with rows still missing stops the run (``when`` says at which wait); one that exits after they all landed does
    not."""
    deadline = time.monotonic() + timeout
    while poller.rows < rows and time.monotonic() < deadline and all(job.alive() for job in jobs):
        time.sleep(0.2)
    if poller.rows < rows:
        require_alive(jobs, poller, when)


def require_alive(jobs: list[ServerProcess], poller: Poller, when: str) -> None:
    """Stop the run with a job's own error when it has exited: its log goes with the run's scratch folder. The
    poller stops first, so that it does not poll a ClickHouse being shut down."""
    for job in jobs:
        if not job.alive():
            poller.stop.set()
            poller.join()
            raise SystemExit(f"the pipeline exited {when}; the end of its log {job.log_path}:\n{job.log_tail()}")


def trend(sent: np.ndarray, latencies: np.ndarray) -> tuple[float, float]:
    """Median latency of the rows produced in the first and in the last fifth of the run: flat when the
    pipeline keeps up, rising when it falls behind."""
    if not len(sent):
        return float("nan"), float("nan")
    lo, hi = sent.min(), sent.max()
    fifth = (hi - lo) / 5
    return quantile(latencies[sent <= lo + fifth], 0.5), quantile(latencies[sent >= hi - fifth], 0.5)
