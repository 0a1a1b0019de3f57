"""Writes micro-batches into one ClickHouse table, each (writer_id, batch_id) exactly once.

Spark replays a micro-batch after a crash with the same batch id and the same rows, so every write is
keyed by ``(writer_id, batch_id)`` and made idempotent: a batch in the ledger is skipped; otherwise it
is announced (``pending``), sent in chunks of at most ``max_rows`` rows (each chunk one block, marked or
carrying its deduplication token, see mechanism.py), and closed by a ``done`` ledger row. Before the
first write of a sink's life and after a failed attempt, chunks already stored are counted and skipped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from glasspipe_job.clickhouse.errors import SinkError
from glasspipe_job.clickhouse.ledger import PENDING, ROLLED_BACK, Fence, LateRange, Ledger, Superseded
from glasspipe_job.clickhouse.mechanism import Mechanism
from glasspipe_job.clickhouse.names import MARKER_COLUMN, batch_prefix, marker_value, quote_ident
from glasspipe_job.clickhouse.native_block import encode_column, encode_constant_string
from glasspipe_job.clickhouse.native_insert import EncodedColumn, can_insert_encoded, insert_encoded
from glasspipe_job.clickhouse.table import ClickHouseTable
from glasspipe_job.clickhouse.values import (
    canonical_order,
    canonical_order_arrow,
    convert_arrow_column,
    convert_column,
)

log = logging.getLogger(__name__)
# A failed query's last fence check: how long it waits for a batch still writing to let go, and for ClickHouse
# (the job's connection otherwise retries until the server is back; here the query's own error is reported).
FENCE_AFTER_FAILURE_SECONDS = 30.0


@dataclass(frozen=True)
class WriteResult:
    rows_written: int  # rows inserted by this call (skipped chunks and replays excluded)
    chunks: int  # chunks the batch consists of
    skipped_replay: bool  # the ledger already had this batch: nothing was written
    chunks_skipped: int = 0  # chunks found already in the table (a crashed predecessor wrote them)
    attempts: int = 1
    native_chunks: int = 0  # chunks sent as Native column bytes (native_block.py), not as the driver's values


def _overlaps(marker: str, lo: int, hi: int) -> bool:
    """Whether a chunk marker's row range ([a, b) at its end) meets [lo, hi); an unreadable one counts as
    meeting every range (it is stale wherever it is)."""
    try:
        a, b = (int(x) for x in marker.rsplit("/", 1)[1].split("-"))
    except ValueError:
        return True
    return a < hi and b > lo


def _stale_in(lo: int, hi: int, chunks: Mapping[str, int]) -> Callable[[str, int], bool]:
    """A stored chunk that meets rows [lo, hi) of a batch but is not one of ``chunks`` (marker -> rows) as it
    should be: partial, or of another split (a changed maxRows or partitioning)."""
    return lambda marker, rows: _overlaps(marker, lo, hi) and chunks.get(marker) != rows


def chunk_bounds(n_rows: int, max_rows: int) -> list[tuple[int, int]]:
    """[start, end) row ranges of at most max_rows rows; an empty batch has no chunks."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    return [(lo, min(lo + max_rows, n_rows)) for lo in range(0, n_rows, max_rows)]


class ClickHouseSink:
    """The writer ``writer_id`` of ``table``, in chunks of at most ``max_rows`` rows, checking ``fence`` (the
    job's writers have one; see ledger.Fence) before and after each batch. The job opens the table and reads the
    ledger, and decides its writer id, before it builds the sink."""

    def __init__(self, table: ClickHouseTable, writer_id: str, max_rows: int, fence: Fence | None = None) -> None:
        if not writer_id or "/" in writer_id:
            raise ValueError(f"writer_id must be non-empty and contain no '/', got {writer_id!r}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.table = table
        self.ledger = Ledger(table)
        self.writer_id = writer_id
        self.max_rows = max_rows
        # No batch written yet, or the last write_batch failed: chunks of the next batch may be in the table
        # already (from a crashed predecessor, or from our own failed call that Spark now retries).
        self._fresh = True
        self.fence = fence
        self.superseded: str | None = None  # why this writer stopped, once a newer one claimed its partitions
        # Held by the batch thread while it uses the ClickHouse connection (write_parts, check_fence); the
        # main loop's check_fence_between_batches skips while it is held. One clickhouse-driver connection
        # must never run two queries at once ("Simultaneous queries on single connection detected").
        self._writing = threading.RLock()
        self._native = True  # Arrow chunks go as Native column bytes (native_block.py) until the server disagrees

    @property
    def mechanism(self) -> Mechanism | None:
        return self.table.mechanism

    @property
    def _client(self) -> Any:
        return self.table.connection.client

    def open(self) -> ClickHouseSink:
        self.table.open()
        return self

    def close(self) -> None:
        self.table.close()

    def __enter__(self) -> ClickHouseSink:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def committed_offsets(self, writer_id: str | None = None) -> str | None:
        """Offsets of the newest committed batch of a writer (default: this sink's)."""
        entry = self.ledger.newest(writer_id or self.writer_id)
        return entry.offsets if entry else None

    # -- chunks in the table (marker mechanism)

    def chunks_present(self, batch_id: int) -> dict[str, int]:
        """marker value -> rows in the table, for every chunk of this batch already stored."""
        prefix = batch_prefix(self.writer_id, batch_id)
        marker = quote_ident(MARKER_COLUMN)
        rows = self._client.execute(
            f"SELECT {marker}, count() FROM {self.table.full_table} "
            f"WHERE substring({marker}, 1, %(n)s) = %(p)s GROUP BY {marker}",
            {"n": len(prefix.encode()), "p": prefix},
        )
        return {str(m): int(n) for m, n in rows}

    def _clear_stale(self, batch_id: int, stale: Callable[[str, int], bool], what: str) -> dict[str, int]:
        """Delete this batch's chunks for which ``stale(marker, rows)`` holds (partial, or of another split) and
        wait until they are gone (up to the connection's mutation deadline); returns the chunks left."""
        deleting: set[str] = set()
        watch = self.table.mutation_watch(what)

        def attempt(_a: int) -> dict[str, int]:
            present = self.chunks_present(batch_id)
            bad = {m for m, cnt in present.items() if stale(m, cnt)}
            if bad:
                if not bad <= deleting:
                    self._delete_markers(bad - deleting)
                    deleting.update(bad)
                    watch.issued()
                raise watch.pending()
            return present

        result: dict[str, int] = self.table.retrying(what, attempt)
        return result

    def _delete_markers(self, markers: Iterable[str]) -> None:
        """Remove partially stored or stale chunks (a server crash mid-insert, or a changed maxRows)."""
        markers = sorted(markers)
        log.warning("deleting partial/stale chunks %s from %s before rewriting them", markers, self.table.full_table)
        self._client.execute(
            f"ALTER TABLE {self.table.full_table} DELETE WHERE {quote_ident(MARKER_COLUMN)} IN %(m)s",
            {"m": tuple(markers)},
        )

    # -- writing

    def write_batch(self, batch_id: int, data: Mapping[str, Sequence[Any]] | pa.Table, offsets: str,
                    left_closed_ms: int = 0) -> WriteResult:
        """Write one micro-batch exactly once: a replay of a committed (writer_id, batch_id) is skipped.

        ``data``: column name -> values, or an Arrow table (converted column by column with vectorised fast
        paths, ordered by Arrow when the batch spans several chunks)."""
        return self.write_parts(batch_id, [data], offsets, left_closed_ms)

    def write_parts(self, batch_id: int, parts: Iterable[Mapping[str, Sequence[Any]] | pa.Table],
                    offsets: str, left_closed_ms: int = 0,
                    late: Callable[[], Sequence[LateRange]] | None = None) -> WriteResult:
        """``write_batch`` of a batch that arrives in parts (the job's path: one Spark partition at a time, so
        the driver never holds the whole batch). Each part is sorted and cut into chunks of at most
        ``max_rows`` rows on its own; a chunk is named by its rows' range in the batch ([lo, hi) after the
        rows of the parts before it). The parts of a replay must hold the same rows in the same part order
        (their order inside a part may differ): then every chunk is the same on every attempt. ``parts`` is
        consumed once, lazily, and not at all for a replay of a committed batch. ``left_closed_ms``: a left join's
        batch's closed event time (table.CLOSED_COLUMN), recorded with its commit for a successor's hand-over; and
        so is ``late()``, the batch's late rows (ledger.LATE), called once every part was consumed."""
        with self._writing:  # from the ledger lookup on: the main loop's fence check shares the connection
            table = self.table.open()
            committed = table.retrying("looking up the ledger",
                                       lambda _a: self.ledger.done_entry(self.writer_id, batch_id))
            if committed is not None:
                log.info("batch %d of %s is in the ledger already (%d rows): replay skipped", batch_id,
                         self.writer_id, committed[1])
                return WriteResult(0, committed[0], True)
            try:
                if self.superseded is not None:
                    raise Superseded(self.superseded)
                return self._write_new_batch(batch_id, parts, offsets, left_closed_ms, late)
            except Superseded as e:
                self._step_down(batch_id, e)
                raise

    def check_fence(self) -> None:
        """Raise Superseded if a newer writer claimed our partitions (for what the job does besides writing
        rows, e.g. sending a batch's dead letters, which a stale writer must not repeat)."""
        with self._writing:
            if self.superseded is not None:
                raise Superseded(self.superseded)
            if self.fence is not None:
                self.fence.check()

    def check_fence_between_batches(self) -> None:
        """For the job's main loop, so that an idle stale writer stops too: raise Superseded if a newer writer
        claimed our partitions. Skipped while a batch is being written (its own checks cover it); once it
        raised, every later write_batch refuses to write."""
        if self.fence is None or not self._writing.acquire(blocking=False):
            return
        try:
            self.fence.check()
        except Superseded as e:
            self.superseded = str(e)
            log.error("%s", e)
            raise
        finally:
            self._writing.release()

    def superseded_after_failure(self) -> str | None:
        """Once the query failed for a reason of its own: why this writer is stale, if a newer writer had
        claimed its partitions by then. A replica paused past a rescale can fail on Kafka when it wakes,
        before its next fence check; the newer layout, not that error, is then why it stops. None when no
        newer writer claimed them, or the ledger cannot be read (the query's own error stands)."""
        if self.superseded is not None or self.fence is None:
            return self.superseded
        if not self._writing.acquire(timeout=FENCE_AFTER_FAILURE_SECONDS):
            return None
        try:
            with self.table.connection.retries_within(FENCE_AFTER_FAILURE_SECONDS):
                self.fence.check()
        except Superseded as e:
            self.superseded = str(e)
        except Exception as e:  # the query's own failure is what gets reported then
            log.warning("could not read the ledger's claims after the query failed: %s", e)
        finally:
            self._writing.release()
        return self.superseded

    def _step_down(self, batch_id: int, why: Superseded) -> None:
        """A newer writer claimed our partitions: remove whatever this writer stored of the batch (it will not
        be committed; the newer writer writes these records), mark it rolled back, remember why."""
        self.superseded = str(why)
        log.error("%s; removing what it wrote of batch %d", why, batch_id)
        prefix = batch_prefix(self.writer_id, batch_id)
        if self.table.has_marker:
            self.ledger.remove_chunks(prefix, self.table.mutation_watch(f"removing stale batch {prefix}"))
        if ROLLED_BACK not in self.table.retrying("reading the ledger",
                                                  lambda _a: self.ledger.states(self.writer_id, batch_id)):
            self.table.retrying("writing the ledger", lambda _a: self.ledger.insert(
                self.writer_id, batch_id, 0, 0, "[]", state=ROLLED_BACK))

    def _write_new_batch(self, batch_id: int, parts: Iterable[Mapping[str, Sequence[Any]] | pa.Table],
                         offsets: str, left_closed_ms: int,
                         late: Callable[[], Sequence[LateRange]] | None) -> WriteResult:
        table = self.table
        if self.fence is not None:
            self.fence.check()  # before anything of the batch is written
        check_first = self._fresh
        self._fresh = True  # until the done row is written: a failure leaves chunks for the next attempt
        # Announce the batch and its offsets before any chunk: a successor that takes over these partitions
        # after this writer is gone finds and rolls back what a crash left behind. Rows and chunks are not
        # known yet (the parts have not been read): 0 in the pending row, the counts in the done row.
        table.retrying(f"announcing batch {batch_id} in the ledger",
                       lambda _a: self.ledger.insert(self.writer_id, batch_id, 0, 0, offsets, state=PENDING))
        present: dict[str, int] = {}
        if table.has_marker and check_first:
            present = table.retrying("looking for chunks stored before", lambda _a: self.chunks_present(batch_id))
        stats = {"written": 0, "skipped": 0, "attempts": 1, "chunks": 0, "native": 0}
        expected: dict[str, int] = {}  # every chunk of the batch so far: marker -> rows
        base = 0
        for part in parts:
            n = self._check_data(part)
            bounds = [(base + lo, base + hi) for lo, hi in chunk_bounds(n, self.max_rows)]
            mine = {marker_value(self.writer_id, batch_id, lo, hi): hi - lo for lo, hi in bounds}
            expected.update(mine)
            stale = _stale_in(base, base + n, mine)
            if any(stale(m, cnt) for m, cnt in present.items()):
                present = self._clear_stale(batch_id, stale,
                                            f"deleting partial/stale chunks of batch {batch_id} of {self.writer_id}")
            rows = self._ordered(part, len(bounds) > 1)
            for lo, hi in bounds:
                marker = marker_value(self.writer_id, batch_id, lo, hi)
                if present.get(marker) == hi - lo:  # a crashed predecessor (or our failed call) wrote it
                    stats["skipped"] += 1
                    continue
                self._insert_chunk(batch_id, marker, self._chunk(rows, lo - base, hi - base), hi - lo, stats)
            stats["chunks"] += len(bounds)
            base += n
        if any(m not in expected for m in present):  # chunks past the batch's end (another split)
            present = self._clear_stale(batch_id, lambda m, _cnt: m not in expected,
                                        f"deleting stale chunks of batch {batch_id} of {self.writer_id}")
        late_rows = late() if late is not None else ()

        def commit(k_attempt: int) -> None:
            if k_attempt > 0 and self.ledger.done_entry(self.writer_id, batch_id) is not None:
                return  # the ledger insert of a previous attempt landed; only its answer was lost
            if self.fence is not None:
                self.fence.check()  # just before the commit: a newer writer may have taken over meanwhile
            self.ledger.insert(self.writer_id, batch_id, stats["chunks"], base, offsets, left_closed_ms=left_closed_ms,
                               late=late_rows)

        table.retrying(f"committing batch {batch_id} to {table.full_table}", commit)
        self._fresh = False
        if stats["skipped"]:
            log.warning("batch %d: %d chunk(s) were already in %s (written before a crash) and were skipped",
                        batch_id, stats["skipped"], table.full_table)
        return WriteResult(stats["written"], stats["chunks"], False, stats["skipped"], stats["attempts"],
                           stats["native"])

    def _insert_chunk(self, batch_id: int, marker: str, chunk: pa.Table | list[list[Any]], n: int,
                      stats: dict[str, int]) -> None:
        """One chunk as one block, retried: on a retry a chunk found complete is our own INSERT that landed
        (only its answer was lost); a partial one is deleted (waited for) and sent again. An Arrow chunk goes
        as Native column bytes when every column has an exact encoding (native_block.py), else as the driver's
        Python values."""
        table = self.table
        names = [c.name for c in table.columns]
        if table.has_marker:
            names.append(MARKER_COLUMN)
        insert_sql = f"INSERT INTO {table.full_table} ({', '.join(quote_ident(x) for x in names)}) VALUES"
        settings: dict[str, Any] = {"insert_block_size": max(n, 1)}
        if table.mechanism is Mechanism.TOKEN:
            settings.update(insert_deduplicate=1, insert_deduplication_token=marker)
        watch = table.mutation_watch(f"deleting partial chunk {marker}")
        encoded = self._encoded(chunk, marker, n) if isinstance(chunk, pa.Table) else None
        values: list[list[Any]] | None = None if isinstance(chunk, pa.Table) else chunk

        def attempt(k_attempt: int) -> None:
            nonlocal values
            if k_attempt > 0:
                stats["attempts"] = max(stats["attempts"], k_attempt + 1)
            if k_attempt > 0 and table.has_marker:
                stored = self.chunks_present(batch_id).get(marker, 0)
                if stored == n:
                    return
                if stored:
                    if watch.started is None:
                        self._delete_markers([marker])
                        watch.issued()
                    raise watch.pending()
            if encoded is not None and can_insert_encoded(self._client):
                if insert_encoded(self._client, insert_sql, encoded, n, settings):
                    stats["native"] += 1
                    return
                self._native = False
                log.info("%s's columns are not the types its Native encoding expected (%s): chunks go as "
                         "Python values from now on", table.full_table, [(c.name, c.ch_type) for c in encoded])
            if values is None:
                values = self._arrow_values(chunk)
            cols = [*values, [marker] * n] if table.has_marker else values
            # fresh lists on every attempt: the driver rewrites them in place
            self._client.execute(insert_sql, [list(c) for c in cols], columnar=True, settings=settings)

        table.retrying(f"writing chunk {marker} to {table.full_table}", attempt)
        stats["written"] += n

    def _encoded(self, chunk: pa.Table, marker: str, n: int) -> list[EncodedColumn] | None:
        """The chunk's columns (and its marker) as Native bytes; None when a column has no exact encoding."""
        if not self._native:
            return None
        types = self.table.table_types
        out = []
        for c in self.table.columns:
            data = encode_column(c.name, types[c.name], chunk.column(c.name))
            if data is None:
                return None
            out.append(EncodedColumn(c.name, types[c.name], data))
        if self.table.has_marker:
            out.append(EncodedColumn(MARKER_COLUMN, "String", encode_constant_string(marker, n)))
        return out

    def _arrow_values(self, chunk: pa.Table) -> list[list[Any]]:
        """The table's columns of an Arrow chunk as the driver's Python values (values.convert_arrow_column)."""
        types = self.table.table_types
        return [convert_arrow_column(c.name, types[c.name], chunk.column(c.name)) for c in self.table.columns]

    def _ordered(self, data: Mapping[str, Sequence[Any]] | pa.Table, ordered: bool) -> pa.Table | list[list[Any]]:
        """A part's columns in the table's order: an Arrow table (converted chunk by chunk) or, for a mapping,
        converted lists; with ``ordered`` (several chunks) rows are sorted by value, so chunk k is the same
        rows on a replay, whatever order Spark produced them in."""
        if isinstance(data, pa.Table):
            arrow = data.select([c.name for c in self.table.columns])
            if not ordered:
                return arrow
            order = canonical_order_arrow(arrow)
            if order is not None:
                return arrow.take(order)
        return self._converted(data, ordered)

    def _chunk(self, rows: pa.Table | list[list[Any]], lo: int, hi: int) -> pa.Table | list[list[Any]]:
        if isinstance(rows, pa.Table):
            return rows.slice(lo, hi - lo)
        return [col[lo:hi] for col in rows]

    def _converted(self, data: Mapping[str, Sequence[Any]] | pa.Table, ordered: bool) -> list[list[Any]]:
        """The batch's columns in the table's order and the driver's value forms; with ``ordered`` (several
        chunks) rows are sorted by value, so chunk k is the same rows on a replay, whatever order Spark
        produced them in."""
        table = self.table
        types = table.table_types
        if isinstance(data, pa.Table):
            arrow = data.select([c.name for c in table.columns])
            if ordered:
                order = canonical_order_arrow(arrow)
                if order is None:
                    return self._converted({c: arrow.column(c).to_pylist() for c in arrow.column_names}, ordered)
                arrow = arrow.take(order)
            return self._arrow_values(arrow)
        raw = [data[c.name] for c in table.columns]
        if ordered:
            order = canonical_order(raw)
            raw = [[col[i] for i in order] for col in raw]
        return [convert_column(c.name, types[c.name], col) for c, col in zip(table.columns, raw, strict=True)]

    def _check_data(self, data: Mapping[str, Sequence[Any]] | pa.Table) -> int:
        names = {c.name for c in self.table.columns}
        if isinstance(data, pa.Table):
            extra = set(data.column_names) - names
            missing = names - set(data.column_names)
            if missing or extra:
                raise SinkError(f"batch columns do not match the sink's: missing {sorted(missing)}, "
                                f"extra {sorted(extra)}")
            return data.num_rows
        missing = names - data.keys()
        extra = set(data.keys()) - names
        if missing or extra:
            raise SinkError(f"batch columns do not match the sink's: missing {sorted(missing)}, extra {sorted(extra)}")
        lengths = {len(data[c.name]) for c in self.table.columns}
        if len(lengths) > 1:
            raise SinkError(f"batch columns have different lengths: {sorted(lengths)}")
        return lengths.pop()
