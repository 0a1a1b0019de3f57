"""The ledger: what every writer of a pipeline announced and committed, and the roll-back of what a
stopped writer left half-written.

One row per (writer, batch, state) in ``glasspipe_ledger`` (DDL in table.py), with the batch's Kafka
end offsets. The protocol, read together with ``glasspipe_job.handover``:

1. the sink announces a batch as ``pending`` (with its offsets) before it sends any chunk;
2. it writes ``done`` once every chunk is stored: the batch is committed (its offsets count as progress); the
   same INSERT stores the ranges of the batch's late rows (LATE), which a successor's warm-up reads;
3. a successor that takes over the partitions of a stopped writer (a rescale) finds batches that are
   ``pending`` but never ``done`` (``handover.abandoned_batches``), removes their chunks and writes
   ``rolledback``; then it resumes at the furthest ``done`` offsets (``handover.ledger_progress``).

With the token mechanism every ledger insert carries its own deduplication token, so a retried insert
is stored once.

The ledger gains two rows per batch and is never pruned by the job, so nothing on a hot or start-up path
reads all of a pipeline's rows: claims are also written under one key per pipeline (``claims_key``, a
primary-key lookup for the per-batch fence check), and a replica start reads only the rows the hand-over
decides on (``Ledger.handover_rows``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from glasspipe_job.clickhouse.errors import SinkError
from glasspipe_job.clickhouse.mechanism import Mechanism
from glasspipe_job.clickhouse.mutations import MutationWatch
from glasspipe_job.clickhouse.names import MARKER_COLUMN, batch_prefix, quote_ident
from glasspipe_job.clickhouse.table import ClickHouseTable

log = logging.getLogger(__name__)

PENDING, DONE, ROLLED_BACK = "pending", "done", "rolledback"
# A writer's claim on its partitions, written when it starts (batch_id holds its generation): see Fence.
CLAIMED = "claimed"
# What follows a pipeline's writer prefix ("<namespace>.<pipeline>."): the replica ("0", before the
# hand-over decides) or "<replica>of<replicas>-<hex>" (handover.new_writer_id).
WRITER_SUFFIX_PATTERN = "^[0-9]+(of[0-9]+-[0-9a-f]+)?$"
# Appended to a pipeline's writer prefix: the ledger key under which every claim of the pipeline is written
# again, as {"writer": ..., "offsets": ...}. "#" never occurs in a writer id, so no writer owns this key and
# WRITER_SUFFIX_PATTERN keeps its rows out of pipeline_rows (and out of the reads of earlier versions).
CLAIMS_SUFFIX = "#claims"
# A done batch's late rows (dead-lettered as late) in one Kafka partition, written in the block of its done row: under
# the key "<writer prefix>#late/<topic>/<partition>" (kept out of pipeline_rows as the claims key is), with batch_id
# the highest late offset, so that a successor reads the ranges that reach its warm-up by primary key (late_ranges);
# offsets holds {"writer", "batch", "from", "through", "eventTimeMs"} (LateRange).
LATE = "late"


def claims_key(writer_prefix: str) -> str:
    return f"{writer_prefix}{CLAIMS_SUFFIX}"


def late_key(writer_prefix: str, topic: str, partition: int) -> str:
    return f"{writer_prefix}#{LATE}/{topic}/{partition}"


def writer_prefix_of(writer_id: str) -> str:
    """The pipeline's writer prefix ("<namespace>.<pipeline>.") of a writer id: WRITER_SUFFIX_PATTERN has no dot."""
    return writer_id[:writer_id.rindex(".") + 1]


class LateRange(NamedTuple):
    """The late rows of one done batch in one Kafka partition: their lowest and highest offset and latest event time
    (ms). Within the batch a row was late exactly when its event time was at most ``event_time_ms``
    (io.glasspipe.spark.JudgedLate)."""

    topic: str
    partition: int
    lowest: int
    highest: int
    event_time_ms: int
    writer: str = ""
    batch_id: int = -1


def prefix_upper_bound(prefix: str) -> str:
    """The smallest string above every string that starts with ``prefix`` (UTF-8 keeps code-point order, so
    this holds for ClickHouse's byte-wise comparison): with ``prefix`` itself, a primary-key range."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


# With pipeline_range's parameters: grouped by writer, the writers of the pipeline only (WRITER_SUFFIX_PATTERN).
OF_PIPELINE = "HAVING substring(writer, 1, %(n)s) = %(p)s AND match(substring(writer, %(n)s + 1), %(s)s)"


def pipeline_range(writer_prefix: str) -> tuple[dict[str, Any], str]:
    """Query parameters and a WHERE condition for the rows of one pipeline's writers as a primary-key range."""
    args = {"lo": writer_prefix, "hi": prefix_upper_bound(writer_prefix), "n": len(writer_prefix.encode()),
            "p": writer_prefix, "s": WRITER_SUFFIX_PATTERN}
    return args, "writer >= %(lo)s AND writer < %(hi)s"


def not_rolled_back(ledger_table: str, in_range: str) -> str:
    """A condition on (writer, batch_id): the batch was not rolled back."""
    return (f"(writer, batch_id) NOT IN (SELECT writer, batch_id FROM {ledger_table} WHERE {in_range} "
            "AND state = 'rolledback')")


class LedgerRow(NamedTuple):
    """One ledger row as the hand-over reads it."""

    writer: str
    batch_id: int
    state: str
    offsets: str


class WriterClose(NamedTuple):
    """How far one writer got: its newest done batch's offsets, and up to which event time it closed a left join's
    windows (the highest ``left_closed_ms`` of its done batches)."""

    writer: str
    offsets: str
    left_closed_ms: int


@dataclass(frozen=True)
class LedgerEntry:
    """A committed (``done``) batch of one writer."""

    batch_id: int
    chunks: int
    rows: int
    offsets: str


class Superseded(SinkError):
    """A newer writer claimed partitions of this one: this writer is stale and must stop (see Fence)."""


def claimed_partitions(offsets_json: str) -> set[tuple[str, int]]:
    """(topic, partition) pairs of a claim's (or batch's) offsets: a list of {topic: {partition: offset}}."""
    try:
        loaded = json.loads(offsets_json)
    except ValueError:
        return set()
    entries = loaded if isinstance(loaded, list) else [loaded]
    return {(str(t), int(p)) for e in entries if isinstance(e, dict) for t, parts in e.items() for p in parts}


def next_generation(rows: Sequence[LedgerRow]) -> int:
    """The generation of a writer that starts now: one more than any claim of the pipeline so far."""
    return 1 + max((b for _w, b, st, _o in rows if st == CLAIMED), default=0)


def superseded_by(claims: Sequence[LedgerRow], writer_id: str, generation: int,
                  owned: set[tuple[str, int]]) -> tuple[int, str] | None:
    """The newest claim, (generation, writer), that outranks this writer's on one of its partitions, or None.
    Claims are ranked by (generation, writer id): of two writers that claimed a partition, the later one
    (which read the other's claim before it chose its generation) wins; equal generations (replicas of
    one layout, which own disjoint partitions) are ordered by writer id so that exactly one wins."""
    best: tuple[int, str] | None = None
    for w, gen, state, offsets in claims:
        if state != CLAIMED or (gen, w) <= (generation, writer_id):
            continue
        if claimed_partitions(offsets) & owned and (best is None or (gen, w) > best):
            best = (gen, w)
    return best


class Ledger:
    """Reads and writes the ledger of one table's database (through the table's connection and retries)."""

    def __init__(self, table: ClickHouseTable) -> None:
        self.table = table

    @property
    def _client(self) -> Any:
        return self.table.connection.client

    # -- one writer (the sink's own batches); callers retry

    def done_entry(self, writer_id: str, batch_id: int) -> tuple[int, int] | None:
        """(chunks, rows) of a committed batch, or None."""
        rows = self._client.execute(
            f"SELECT chunks, rows FROM {self.table.ledger_table} WHERE writer = %(w)s AND batch_id = %(b)s "
            "AND state = 'done' LIMIT 1",
            {"w": writer_id, "b": batch_id},
        )
        return (int(rows[0][0]), int(rows[0][1])) if rows else None

    def insert(self, writer_id: str, batch_id: int, chunks: int, rows: int, offsets: str, state: str = DONE,
               token: str | None = None, left_closed_ms: int = 0, late: Sequence[LateRange] = ()) -> None:
        """A ledger row of ``state`` (see the module docstring); ``token``: its deduplication token (token
        mechanism) when ``writer/batch/state`` does not identify it; ``left_closed_ms``: a left join's done batch's
        closed event time (table.CLOSED_COLUMN; kept where the ledger has the column); ``late``: its late rows, one row
        each in the same block (LATE), so they are stored with the done row or not at all."""
        settings: dict[str, Any] = {}
        if self.table.mechanism is Mechanism.TOKEN:
            settings = {"insert_deduplicate": 1,
                        "insert_deduplication_token": token or f"{writer_id}/{batch_id}/ledger-{state}"}
        prefix = writer_prefix_of(writer_id) if late else ""
        rows_of = [(writer_id, batch_id, chunks, rows, offsets, state, left_closed_ms)] + [
            (late_key(prefix, r.topic, r.partition), r.highest, 0, 0,
             json.dumps({"writer": writer_id, "batch": batch_id, "from": r.lowest, "through": r.highest,
                         "eventTimeMs": r.event_time_ms}, sort_keys=True), LATE, 0) for r in late]
        columns = [list(c) for c in zip(*rows_of, strict=True)]
        names, values = "writer, batch_id, chunks, rows, offsets, state", columns[:6]
        if self.table.ledger_has_closed:
            names, values = f"{names}, left_closed_ms", columns
        self._client.execute(
            f"INSERT INTO {self.table.ledger_table} ({names}) VALUES",
            values,
            columnar=True,
            settings=settings or None,
        )

    def states(self, writer_id: str, batch_id: int) -> set[str]:
        rows = self._client.execute(
            f"SELECT DISTINCT state FROM {self.table.ledger_table} WHERE writer = %(w)s AND batch_id = %(b)s",
            {"w": writer_id, "b": batch_id},
        )
        return {str(r[0]) for r in rows}

    # -- retried on their own

    def newest(self, writer_id: str) -> LedgerEntry | None:
        """The newest committed batch of a writer: its batch id and Kafka offsets."""
        self.table.open()

        def q(_attempt: int) -> LedgerEntry | None:
            rows = self._client.execute(
                f"SELECT batch_id, chunks, rows, offsets FROM {self.table.ledger_table} WHERE writer = %(w)s "
                "AND state = 'done' ORDER BY batch_id DESC LIMIT 1",
                {"w": writer_id},
            )
            return LedgerEntry(int(rows[0][0]), int(rows[0][1]), int(rows[0][2]), str(rows[0][3])) if rows else None

        result: LedgerEntry | None = self.table.retrying("reading the ledger", q)
        return result

    def claim(self, writer_prefix: str, writer_id: str, generation: int, offsets: str,
              partitions: Mapping[str, int]) -> None:
        """Announce that ``writer_id`` (generation ``generation``) writes the partitions in ``offsets`` from now
        on: an older writer still running on any of them stops at its next check (Fence). Written as the
        writer's own row (what writers of earlier versions check) and under the pipeline's claims key (what
        ``claims`` reads), there with each topic's partition count as the writer found it (``partitions``, read
        back by ``first_partition_counts``); replicas of one layout may share a generation, so the second row's
        token names the writer."""
        self.table.open()
        key = claims_key(writer_prefix)
        indexed = json.dumps({"writer": writer_id, "offsets": json.loads(offsets), "partitions": dict(partitions)},
                             sort_keys=True)

        def write(_attempt: int) -> None:
            self.insert(writer_id, generation, 0, 0, offsets, state=CLAIMED)
            self.insert(key, generation, 0, 0, indexed, state=CLAIMED, token=f"{key}/{generation}/{writer_id}")

        self.table.retrying("claiming partitions in the ledger", write)

    def _claim_docs(self, writer_prefix: str) -> list[tuple[int, dict[str, Any]]]:
        """(generation, document) of each claim under the pipeline's claims key: one read by primary key."""
        self.table.open()

        def q(_attempt: int) -> list[tuple[int, dict[str, Any]]]:
            rows = self._client.execute(
                f"SELECT batch_id, offsets FROM {self.table.ledger_table} WHERE writer = %(k)s AND state = %(st)s",
                {"k": claims_key(writer_prefix), "st": CLAIMED},
            )
            return [(int(gen), json.loads(doc)) for gen, doc in rows]

        result: list[tuple[int, dict[str, Any]]] = self.table.retrying("reading the pipeline's claims", q)
        return result

    def claims(self, writer_prefix: str) -> list[LedgerRow]:
        """The claims of one pipeline's writers, as (writer, generation, 'claimed', offsets): one row per
        replica start, read by primary key (the fence check runs several times per batch)."""
        return [LedgerRow(str(d["writer"]), gen, CLAIMED, json.dumps(d["offsets"]))
                for gen, d in self._claim_docs(writer_prefix)]

    def first_partition_counts(self, writer_prefix: str) -> dict[str, int]:
        """Per topic, the fewest partitions a writer of the pipeline found when it claimed: the count when the
        pipeline first started, so a partition numbered at or above it was added since (handover.new_start).
        Topics only claims of earlier versions name (without counts) are left out."""
        out: dict[str, int] = {}
        for _gen, d in self._claim_docs(writer_prefix):
            for topic, count in d.get("partitions", {}).items():
                out[topic] = min(int(count), out.get(topic, int(count)))
        return out

    def handover_rows(self, writer_prefix: str) -> list[LedgerRow]:
        """The rows of one pipeline's writers that the hand-over decides on, with the same outcome as every
        row (``handover.ledger_progress``, ``abandoned_batches``, ``next_generation``): all claims and
        roll-backs, and per writer the rows from its newest ``done`` batch that was not rolled back. A writer
        finishes its batches in order and its end offsets only grow, so its older rows change nothing. Two
        small reads by primary-key range, not the whole history (which grows by two rows per batch)."""
        self.table.open()
        led = self.table.ledger_table
        args, in_range = pipeline_range(writer_prefix)

        def q(_attempt: int) -> list[LedgerRow]:
            last_done = self._client.execute(
                f"SELECT writer, maxIf(batch_id, state = 'done' AND {not_rolled_back(led, in_range)}) FROM {led} "
                f"WHERE {in_range} GROUP BY writer {OF_PIPELINE}", args)
            if not last_done:
                return []
            writers, firsts = [str(w) for w, _ in last_done], [int(b) for _, b in last_done]
            rows = self._client.execute(
                f"SELECT writer, batch_id, state, offsets FROM {led} WHERE writer IN %(w)s AND (state IN "
                "('claimed', 'rolledback') OR batch_id >= transform(writer, %(wl)s, %(bl)s, toUInt64(0)))",
                {"w": tuple(writers), "wl": writers, "bl": firsts})
            return [LedgerRow(str(w), int(b), str(st), str(o)) for w, b, st, o in rows]

        result: list[LedgerRow] = self.table.retrying("reading the ledger", q)
        return result

    def left_closed(self, writer_prefix: str) -> list[WriterClose]:
        """Per writer of one pipeline: the end offsets of its newest done batch that was not rolled back and the
        highest ``left_closed_ms`` of its done batches (handover.closed_windows); none where the ledger lacks the
        column. One read by primary-key range."""
        self.table.open()
        if not self.table.ledger_has_closed:
            return []
        led = self.table.ledger_table
        args, in_range = pipeline_range(writer_prefix)

        def q(_attempt: int) -> list[WriterClose]:
            rows = self._client.execute(
                f"SELECT writer, argMax(offsets, batch_id), max(left_closed_ms) FROM {led} WHERE {in_range} AND "
                f"state = 'done' AND {not_rolled_back(led, in_range)} GROUP BY writer {OF_PIPELINE}", args)
            return [WriterClose(str(w), str(o), int(wm)) for w, o, wm in rows]

        result: list[WriterClose] = self.table.retrying("reading how far the ledger's writers closed", q)
        return result

    def late_ranges(self, writer_prefix: str, warmup: Mapping[str, Mapping[int, int]]) -> list[LateRange]:
        """The late ranges (LATE) of one pipeline's done batches that end at or past the warm-up's start in a
        partition of ``warmup`` (its offset there), for handover.judged_late. One read by primary key."""
        self.table.open()
        keys = [(late_key(writer_prefix, t, p), off) for t, parts in sorted(warmup.items())
                for p, off in sorted(parts.items())]
        if not keys:
            return []
        args: dict[str, Any] = {"st": LATE}
        for i, (key, off) in enumerate(keys):
            args.update({f"k{i}": key, f"o{i}": off})
        reach = " OR ".join(f"(writer = %(k{i})s AND batch_id >= %(o{i})s)" for i in range(len(keys)))

        def q(_attempt: int) -> list[LateRange]:
            rows = self._client.execute(
                f"SELECT writer, offsets FROM {self.table.ledger_table} WHERE ({reach}) AND state = %(st)s", args)
            out = []
            head = len(late_key(writer_prefix, "", 0)) - 2  # "<prefix>#late/": the key's topic follows
            for key, doc in rows:
                topic, partition = str(key)[head:].rsplit("/", 1)
                d = json.loads(doc)
                out.append(LateRange(topic, int(partition), int(d["from"]), int(d["through"]), int(d["eventTimeMs"]),
                                     str(d["writer"]), int(d["batch"])))
            return out

        result: list[LateRange] = self.table.retrying("reading the late rows of the ledger's batches", q)
        return result

    def pipeline_rows(self, writer_prefix: str, state: str | None = None) -> list[LedgerRow]:
        """Every ledger row of one pipeline's writers: the prefix followed by a replica suffix only, so
        that pipeline ``orders`` never reads the rows of ``orders.v2``. (For inspection and tests: the job
        reads ``handover_rows`` and ``claims``.)"""
        self.table.open()

        def q(_attempt: int) -> list[LedgerRow]:
            rows = self._client.execute(
                f"SELECT writer, batch_id, state, offsets FROM {self.table.ledger_table} "
                "WHERE substring(writer, 1, %(n)s) = %(p)s AND match(substring(writer, %(n)s + 1), %(s)s)"
                + (" AND state = %(st)s" if state else ""),
                {"n": len(writer_prefix.encode()), "p": writer_prefix, "s": WRITER_SUFFIX_PATTERN, "st": state},
            )
            return [LedgerRow(str(w), int(b), str(st), str(o)) for w, b, st, o in rows]

        result: list[LedgerRow] = self.table.retrying("reading the ledger", q)
        return result

    def roll_back(self, writer_id: str, batch_id: int, offsets: str) -> int:
        """Remove every chunk an abandoned (never done) batch of another writer left in the table, then
        write ``rolledback``. Returns the rows removed.

        It runs even if that writer's ``done`` row appears meanwhile (a stale writer that was still alive):
        the caller decided from a ledger read without it, and resumes before the batch; a rolled-back batch
        never counts as progress (handover.ledger_progress). A chunk that lands after the DELETE was issued
        (the stale writer finishing an INSERT) is not covered by that mutation: once no mutation for the
        batch is left running, the DELETE is issued again."""
        table = self.table.open()
        prefix = batch_prefix(writer_id, batch_id)
        found: list[int] = []  # rows of the batch seen before the first delete was issued
        watch = table.mutation_watch(f"rolling back batch {prefix}")

        def before(_left: int) -> bool:
            return ROLLED_BACK not in self.states(writer_id, batch_id)

        def after() -> None:
            self.insert(writer_id, batch_id, 0, 0, offsets, state=ROLLED_BACK)

        self.remove_chunks(prefix, watch, found, before, after)
        return found[0] if found else 0

    def remove_chunks(self, prefix: str, watch: MutationWatch, found: list[int] | None = None,
                      before: Callable[[int], bool] | None = None, after: Callable[[], None] | None = None) -> None:
        """Delete every row whose marker starts with ``prefix`` and wait until none is left (re-issuing the
        DELETE for rows that landed after it), bounded by the mutation deadline. ``before(rows_left)`` may
        cancel (False); ``after()`` runs once none is left. Retried by the table's retry loop."""
        table = self.table
        marker = quote_ident(MARKER_COLUMN)
        where = f"substring({marker}, 1, {len(prefix.encode())}) = %(p)s"
        quoted = "'" + prefix.replace("\\", "\\\\").replace("'", "\\'") + "'"

        def remove(_attempt: int) -> None:
            left = int(self._client.execute(f"SELECT count() FROM {table.full_table} WHERE {where}",
                                            {"p": prefix})[0][0])
            if found is not None and not found:
                found.append(left)
            if before is not None and not before(left):
                return
            if left:
                running = watch.running()
                if watch.started is None or not any(quoted in m.command for m in running):
                    log.warning("deleting %d rows of %s* from %s", left, prefix, table.full_table)
                    self._client.execute(f"ALTER TABLE {table.full_table} DELETE WHERE {where}", {"p": prefix})
                    watch.issued()
                    running = watch.running()
                raise watch.pending(running)
            if after is not None:
                after()

        table.retrying(watch.what, remove)


@dataclass(frozen=True)
class Fence:
    """Keeps a stale writer out. Every writer claims its partitions in the ledger when it starts, with a
    generation above every earlier claim of the pipeline (Ledger.claim). A writer checks, before it writes a
    batch and again just before the batch's ``done`` row, that no claim outranks its own on its partitions
    (``superseded_by``); if one does, a newer layout took over while this one was thought gone (a driver
    that kept running after its pod was deleted, a paused process): it removes what it wrote of the batch
    and stops with ``Superseded``."""

    ledger: Ledger
    writer_prefix: str
    writer_id: str
    generation: int
    owned: frozenset[tuple[str, int]]

    def check(self) -> None:
        newer = superseded_by(self.ledger.claims(self.writer_prefix), self.writer_id, self.generation,
                              set(self.owned))
        if newer is not None:
            raise Superseded(
                f"writer {self.writer_id} (generation {self.generation}) is superseded by writer {newer[1]} "
                f"(generation {newer[0]}), which claimed partitions of this replica: a newer replica layout "
                "has taken over, so this stale replica stops (nothing is lost: the new layout writes these "
                "records)"
            )
