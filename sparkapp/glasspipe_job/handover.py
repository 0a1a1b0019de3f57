"""Hand-over of partitions between generations of replicas (rescaling), without loss or duplicates.

Each replica layout (replica i of N) has its own Spark checkpoint. When a replica starts, it decides
from the ClickHouse ledger (what every writer of the pipeline has committed, per partition) whether
its checkpoint is still the furthest point for its partitions:

* yes: resume the checkpoint (a normal restart; replays are made idempotent by the sink);
* no (another layout processed its partitions since, e.g. after 2 -> 3 -> 2), or no checkpoint: set
  the old checkpoint aside and start a new one (a new *writer*):
  1. roll back batches that a stopped writer announced (``pending``) but never finished, on these
     partitions: their chunks are removed, so they are written again below, once;
  2. resume writing at the ledger's furthest offset per partition (else the consumer group's
     committed offset, else where an earlier writer claimed to start it, else EARLIEST for a partition
     added since the pipeline first started, else ``startingOffsets``: ``new_start``);
  3. if the source deduplicates, read from ``window + allowedLateness`` before that point, through the
     dedup operator only (*warm-up*: rows before the resume offset update the state and are not
     written), so keys whose window is still open stay deduplicated across the rescale. A join re-reads
     its window the same way; a left join also records which re-read left rows earlier writers wrote
     already (``closed_windows``, from the ledger's ``left_closed_ms``), so they are not written again.
     A re-read row that its first writer found late (it is in the dead-letter topic) is late again
     (``judged_late``, from the late ranges the ledger keeps): it must not enter the state now.
The decision is written next to the checkpoint (``glasspipe-handover.json``) so that restarts of the
new checkpoint replay exactly the same way. docs/scaling.md explains the protocol; the ledger rows it
reads, and the roll-back, are in ``glasspipe_job.clickhouse.ledger``. ``resumable`` and ``new_start``
decide (pure); ``glasspipe_job.runner.prepare_handover`` gathers their inputs and carries them out, all
before the sink is built with the writer id decided here.

Safety rests on stop-first rescaling: the operator starts a new layout only after every application of
the old one has stopped, so no writer that is rolled back or superseded is still running.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from confluent_kafka import Consumer, TopicPartition

from glasspipe.api import models
from glasspipe.api.durations import parse_duration_ms
from glasspipe_job.clickhouse.ledger import CLAIMED, DONE, PENDING, ROLLED_BACK, LateRange
from glasspipe_job.kafka_offsets import EARLIEST, LATEST

log = logging.getLogger("glasspipe.job")

HANDOVER_FILE = "glasspipe-handover.json"
Offsets = dict[str, dict[int, int]]  # topic -> partition -> next offset to read
# topic -> partition -> (end offset, closed event time ms) of each earlier writer that read past the warm-up start
ClosedWindows = dict[str, dict[int, list[tuple[int, int]]]]
# topic -> partition -> (lowest offset, highest offset, latest event time ms) of each batch's late rows (judged_late)
JudgedLate = dict[str, dict[int, list[tuple[int, int, int]]]]


@dataclass(frozen=True)
class Handover:
    """How one checkpoint of one replica started: persisted, so that replays are deterministic."""

    writer_id: str
    resume: Offsets  # rows before these offsets were written by earlier writers
    read_from: Offsets  # where the query starts reading (<= resume: the warm-up range)
    # the shape of the query's state (its stateful operators): a checkpoint made by another plan cannot
    # resume; "" for checkpoints written before plans were recorded (a join's then used Spark's join)
    plan: str = ""
    # a left join's: per left partition, (end offset, closed event time ms) of each earlier writer (closed_windows)
    closed: ClosedWindows = field(default_factory=dict)
    # the warm-up rows earlier writers found late, per topic and partition (judged_late)
    late: JudgedLate = field(default_factory=dict)

    def to_json(self) -> str:
        doc: dict[str, Any] = {"writerId": self.writer_id, "resume": self.resume, "readFrom": self.read_from,
                               "plan": self.plan}
        if self.closed:
            doc["closed"] = {t: {str(p): [list(s) for s in steps] for p, steps in parts.items()}
                             for t, parts in self.closed.items()}
        if self.late:
            doc["late"] = {t: {str(p): [list(r) for r in ranges] for p, ranges in parts.items()}
                           for t, parts in self.late.items()}
        return json.dumps(doc, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Handover:
        d = json.loads(text)

        def offsets(o: dict[str, dict[str, int]]) -> Offsets:
            return {t: {int(p): int(v) for p, v in parts.items()} for t, parts in o.items()}

        closed = {t: {int(p): [(int(e), int(w)) for e, w in steps] for p, steps in parts.items()}
                  for t, parts in d.get("closed", {}).items()}
        late = {t: {int(p): [(int(lo), int(hi), int(m)) for lo, hi, m in ranges] for p, ranges in parts.items()}
                for t, parts in d.get("late", {}).items()}
        return Handover(d["writerId"], offsets(d["resume"]), offsets(d["readFrom"]), d.get("plan", ""), closed, late)

    @staticmethod
    def from_record(text: str) -> Handover | None:
        """The record in a checkpoint's hand-over file, or None when it cannot be read: a job killed while it
        wrote the file on a file system without atomic renames leaves it empty or cut short, and such a
        checkpoint is set aside like one without a record (the ledger says where to start)."""
        try:
            return Handover.from_json(text)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def with_partitions_added(self, owned: Offsets) -> Handover:
        """The record with the ``owned`` partitions it does not name (added to the topic since this checkpoint
        started) at EARLIEST: Spark reads the partitions it discovers from their start, and takes specific
        starting offsets (a checkpoint without the query's first offsets) only when they name every partition."""
        def completed(offsets: Offsets) -> Offsets:
            return {t: {**{p: EARLIEST for p in owned.get(t, {})}, **offsets.get(t, {})}
                    for t in sorted({*offsets, *owned})}

        return replace(self, resume=completed(self.resume), read_from=completed(self.read_from))

    def warmup_partitions(self) -> Offsets:
        """Partitions whose query starts before the resume offset (these have warm-up rows)."""
        return {t: {p: r for p, r in parts.items() if self.read_from.get(t, {}).get(p, r) < r}
                for t, parts in self.resume.items()}


# ------------------------------------------------------------------------------------ pure ledger math


def merge_offsets(entries: Iterable[Mapping[str, Mapping[Any, int]] | None]) -> Offsets:
    """One Offsets from a list of {topic: {partition: offset}} (one entry per source)."""
    out: Offsets = {}
    for entry in entries:
        for topic, parts in (entry or {}).items():
            for p, off in parts.items():
                out.setdefault(topic, {})[int(p)] = int(off)
    return out


def records_between(start: Offsets, end: Offsets) -> int | None:
    """Kafka records from ``start`` to ``end`` (a micro-batch's offset range); None when a partition of ``end``
    has no start (its size is unknown)."""
    total = 0
    for topic, parts in end.items():
        for p, off in parts.items():
            begin = start.get(topic, {}).get(p)
            if begin is None:
                return None
            total += max(0, off - begin)
    return total


def _batch_offsets(offsets_json: str) -> Offsets:
    """The offsets a ledger row records: a list (one entry per source) of {topic: {partition: offset}}."""
    try:
        loaded = json.loads(offsets_json)
    except ValueError:
        return {}
    return merge_offsets(loaded if isinstance(loaded, list) else [loaded])


def ledger_progress(rows: Sequence[tuple[str, int, str, str]], except_writer: str | None = None) -> Offsets:
    """Per partition, the furthest end offset of any batch that is done (written completely) and not rolled
    back, by any writer or by every writer but ``except_writer``. (A stale writer may write ``done`` after a
    successor rolled the batch back: its rows are gone then, and the successor writes those records.)"""
    rolled_back = {(w, b) for w, b, st, _ in rows if st == ROLLED_BACK}
    out: Offsets = {}
    for writer, batch, state, offsets in rows:
        if state != DONE or writer == except_writer or (writer, batch) in rolled_back:
            continue
        for topic, parts in _batch_offsets(offsets).items():
            for p, off in parts.items():
                if off > out.setdefault(topic, {}).get(p, -1):
                    out[topic][p] = off
    return out


def abandoned_batches(rows: Sequence[tuple[str, int, str, str]], owned: Offsets,
                      except_writer: str) -> list[tuple[str, int, str]]:
    """(writer, batch, offsets) announced but neither done nor rolled back, touching owned partitions."""
    states: dict[tuple[str, int], set[str]] = {}
    offsets_of: dict[tuple[str, int], str] = {}
    for writer, batch, state, offsets in rows:
        states.setdefault((writer, batch), set()).add(state)
        if state == PENDING:
            offsets_of[(writer, batch)] = offsets
    out = []
    for (writer, batch), st in sorted(states.items()):
        if writer == except_writer or st & {DONE, ROLLED_BACK} or PENDING not in st:
            continue
        touched = _batch_offsets(offsets_of[(writer, batch)])
        if any(p in owned.get(t, {}) for t, parts in touched.items() for p in parts):
            out.append((writer, batch, offsets_of[(writer, batch)]))
    return out


def is_superseded(committed: Offsets, others: Offsets) -> bool:
    """True when another writer has written past this checkpoint's last committed batch on one of its
    partitions (``others``: ``ledger_progress`` without this checkpoint's writer).

    Compared with what the checkpoint *committed*, not what it planned: a batch planned but not
    committed would be replayed in full on resume, and another layout may have written exactly those
    records meanwhile (the planned end equals the other layout's progress then). This writer's own
    done batches beyond its commit (a crash between the ledger and Spark's commit) are replays the
    sink recognises, so they never make a checkpoint superseded. A partition no other writer has
    written never supersedes, whatever this checkpoint holds for it (-2, "earliest", included).
    """
    return any(p in others.get(t, {}) and others[t][p] > off for t, parts in committed.items()
               for p, off in parts.items())


# ------------------------------------------------------------------------------------- the decision


def resumable(previous: Handover | None, committed: Offsets | None, rows: Sequence[tuple[str, int, str, str]]) -> bool:
    """Resume a checkpoint? Only with its hand-over record (``previous``), and only while no other writer
    has written its partitions past what the checkpoint ``committed`` (its newest commit-log entry, else
    where it resumed): see ``is_superseded``."""
    if previous is None:
        return False
    return not is_superseded(committed or previous.resume, ledger_progress(rows, except_writer=previous.writer_id))


def new_writer_id(prefix: str, replica: int, replicas: int) -> str:
    return f"{prefix}{replica}of{replicas}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class NewStart:
    """How a new checkpoint starts: the abandoned batches to roll back first, then where to resume."""

    writer_id: str
    roll_back: list[tuple[str, int, str]]  # (writer, batch, offsets) of batches a stopped writer never finished
    resume: Offsets


def claimed_starts(rows: Sequence[tuple[str, int, str, str]]) -> Offsets:
    """Per partition, the earliest point a writer of the pipeline claimed to start reading it at: EARLIEST, or an
    offset. A claim's LATEST (written before the job resolved it to an offset) says nothing of where that was."""
    out: Offsets = {}
    for _writer, _gen, state, offsets in rows:
        if state != CLAIMED:
            continue
        for topic, parts in _batch_offsets(offsets).items():
            for p, off in parts.items():
                known = out.setdefault(topic, {}).get(p)
                if off != LATEST and (known is None or off < known):  # EARLIEST (-2) is below every offset
                    out[topic][p] = off
    return out


def new_start(writer_id: str, rows: Sequence[tuple[str, int, str, str]], owned: Offsets, committed: Offsets,
              fallback: Mapping[str, int], first_partitions: Mapping[str, int]) -> NewStart:
    """Per owned partition, resume at the ledger's furthest done offset, else the consumer group's committed
    offset, else where an earlier writer claimed to start it (none of its rows were written since), else at
    EARLIEST for a partition added to the topic after the pipeline first started (``first_partitions``: the
    topic's partition count then, as the ledger's claims recorded it; Spark's Kafka source reads the partitions
    it discovers from their start too), else ``fallback[topic]`` (EARLIEST or LATEST, from ``startingOffsets``).
    A LATEST left in ``resume`` is resolved to an offset by the caller before it is claimed."""
    progress, claimed = ledger_progress(rows), claimed_starts(rows)

    def resume_at(topic: str, p: int) -> int:
        for known in (progress, committed, claimed):
            if p in known.get(topic, {}):
                return known[topic][p]
        added_since = topic in first_partitions and p >= first_partitions[topic]
        return EARLIEST if added_since else fallback[topic]

    resume = {t: {p: resume_at(t, p) for p in parts} for t, parts in owned.items()}
    return NewStart(writer_id, abandoned_batches(rows, owned, writer_id), resume)


def warmup_lookback_ms(source: models.Source, join: models.Join | None) -> int | None:
    """How far before the resume point a new checkpoint re-reads a source so that its stateful operators
    remember what they must: the longest window (dedup, join) plus the allowed lateness; None: no state.

    A left join's right side goes back one join window more: a left row whose window is still open at the resume
    point (``t > W - window``) may have matched a right row up to a window before it, and only by reading that row
    again does the new writer know the left row matched (else it would write it with NULLs too)."""
    join_ms = parse_duration_ms(join.window) if join else None
    if join_ms is not None and join is not None and join.type != "inner" and join.right.source == source.name:
        join_ms *= 2
    windows = [w for w in (parse_duration_ms(source.deduplication.window) if source.deduplication else None,
                           join_ms) if w]
    if not windows:
        return None
    return max(windows) + parse_duration_ms(source.event_time.allowed_lateness)


def left_closed_through_ms(join: models.Join | None, watermark_ms: int) -> int:
    """A left join's batch: every left record with an event time at or before this (ms) had its window closed by the
    batch's ``watermark_ms`` (``t + window <= W``), so its writer wrote it, matched or with NULLs. 0 for other
    pipelines and before the first watermark. Recorded in the ledger for the next writer (closed_windows):
    as an event time, so it holds whatever join window that writer runs with."""
    if join is None or join.type == "inner" or watermark_ms <= 0:
        return 0
    return watermark_ms - parse_duration_ms(join.window)


def closed_windows(closes: Iterable[tuple[str, str, int]], topic: str, read_from: Mapping[int, int],
                   resume: Mapping[int, int]) -> dict[int, list[tuple[int, int]]]:
    """For a left join's new writer, per partition of its left ``topic`` that has warm-up rows (``read_from`` below
    ``resume``): (end offset, closed event time ms) of each earlier writer (``closes``: (writer, offsets of its
    newest done batch, the event time up to which it closed left windows), ``Ledger.left_closed``) that read past
    ``read_from``.

    A warm-up left row at offset o was read by the writers whose end offset is above o; one of them that closed
    event times up to F >= t wrote it (joined, or with NULLs), so the new writer drops it
    (io.glasspipe.spark.ClosedWindows). Writers that ended at or before ``read_from`` never read a warm-up row, and
    0 is unknown (batches committed before the ledger recorded it, or no window closed yet): both are left out."""
    out: dict[int, list[tuple[int, int]]] = {}
    for _writer, offsets, closed in closes:
        if closed <= 0:
            continue
        for p, end in _batch_offsets(offsets).get(topic, {}).items():
            start = read_from.get(p)
            if start is not None and start < resume.get(p, start) and end > start:
                out.setdefault(p, []).append((end, closed))
    return {p: sorted(steps) for p, steps in sorted(out.items())}


def judged_late(recorded: Iterable[LateRange], rows: Sequence[tuple[str, int, str, str]], read_from: Offsets,
                resume: Offsets) -> JudgedLate:
    """For a new writer: per partition with warm-up rows (``read_from`` below ``resume``), the late ranges that earlier
    writers' done batches recorded (``recorded``, ``Ledger.late_ranges``) and that reach into the warm-up, but those of
    batches rolled back (``rows``: the hand-over's ledger rows; a stale writer may commit a batch a successor rolled
    back, whose records the successor then judged afresh). A warm-up row at an offset in [lo, hi] with event time
    t <= m was late for the writer that read it first, and only such a row was (io.glasspipe.spark.JudgedLate): it is
    in the dead-letter topic, so the new writer keeps it out of its state as that writer did. Sorted by offset."""
    rolled_back = {(w, b) for w, b, st, _ in rows if st == ROLLED_BACK}
    out: JudgedLate = {}
    for r in recorded:
        start, end = read_from.get(r.topic, {}).get(r.partition), resume.get(r.topic, {}).get(r.partition)
        if (r.writer, r.batch_id) in rolled_back or start is None or end is None:
            continue
        if start < end and r.highest >= start and r.lowest < end:
            out.setdefault(r.topic, {}).setdefault(r.partition, []).append((r.lowest, r.highest, r.event_time_ms))
    return {t: {p: sorted(ranges) for p, ranges in sorted(parts.items())} for t, parts in sorted(out.items())}


# ------------------------------------------------------------------------------- checkpoint files


def parse_offset_log(text: str) -> list[dict[str, dict[str, int]]]:
    """An entry of Spark's offset log (``offsets/<batch>``): "v1", the batch metadata, then one line per
    source in the query's source order ("-" for a source without offsets, given as {})."""
    lines = text.splitlines()[2:]
    return [json.loads(line) if line and line != "-" else {} for line in lines]


def parse_batch_watermark(text: str) -> int:
    """The watermark of a batch (epoch ms) from its offset log entry's metadata line: the one Spark's stateful
    operators use for the batch (0 before any event time)."""
    lines = text.splitlines()
    return int(json.loads(lines[1]).get("batchWatermarkMs", 0)) if len(lines) > 1 and lines[1] else 0


class CheckpointFiles:
    """Small files next to a Spark checkpoint, through Hadoop's FileSystem (file://, s3a://, hdfs://)."""

    def __init__(self, spark: Any, root: str) -> None:
        self.jvm = spark.sparkContext._jvm
        self.conf = spark.sparkContext._jsc.hadoopConfiguration()
        self.root = root.rstrip("/")

    def _path(self, rel: str) -> Any:
        return self.jvm.org.apache.hadoop.fs.Path(f"{self.root}/{rel}" if rel else self.root)

    def _fs(self, path: Any) -> Any:
        return path.getFileSystem(self.conf)

    def exists(self, rel: str = "") -> bool:
        path = self._path(rel)
        return bool(self._fs(path).exists(path))

    def _local_file(self, rel: str) -> Path | None:
        """The file itself when the checkpoint is on this machine's file system (``file:``): read without the
        dozen JVM calls a Hadoop read takes (~6 ms: the offset log is read at every micro-batch)."""
        url = urlparse(f"{self.root}/{rel}")
        if url.scheme != "file" or url.netloc not in ("", "localhost"):
            return None
        return Path(unquote(url.path))

    def read(self, rel: str) -> str:
        local = self._local_file(rel)
        if local is not None:
            return local.read_text(encoding="utf-8")
        path = self._path(rel)
        stream = self._fs(path).open(path)
        try:
            return str(self.jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write(self, rel: str, text: str) -> None:
        """``text`` as the file ``rel``; on this machine's file system written aside and renamed over it, so
        that a job killed meanwhile leaves the old file or the new one, never a part of one."""
        local = self._local_file(rel)
        if local is not None:
            local.parent.mkdir(parents=True, exist_ok=True)  # as Hadoop's create makes the folders
            aside = local.with_name(f".{local.name}.tmp")
            with open(aside, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(aside, local)
            return
        path = self._path(rel)
        out = self._fs(path).create(path, True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()

    def _batch_ids(self, folder: str) -> list[int]:
        path = self._path(folder)
        fs = self._fs(path)
        if not fs.exists(path):
            return []
        return [int(s.getPath().getName()) for s in fs.listStatus(path) if s.getPath().getName().isdigit()]

    def latest_committed(self) -> Offsets | None:
        """End offsets of the newest batch Spark committed (commit log), from its offset log entry; None
        before the first commit."""
        committed = self._batch_ids("commits")
        if not committed:
            return None
        return merge_offsets(self.offset_log(max(committed)))

    def offset_log(self, batch_id: int) -> list[dict[str, dict[str, int]]]:
        """End offsets of a batch, one dict per source, from Spark's write-ahead offset log."""
        return parse_offset_log(self.read(f"offsets/{batch_id}"))

    def offset_log_and_watermark(self, batch_id: int) -> tuple[list[dict[str, dict[str, int]]], int]:
        """``offset_log`` and the batch's watermark, from one read of its entry."""
        text = self.read(f"offsets/{batch_id}")
        return parse_offset_log(text), parse_batch_watermark(text)

    def set_aside(self) -> str:
        """Rename the checkpoint folder out of the way (kept for inspection, never reused)."""
        src = self._path("")
        fs = self._fs(src)
        n = 0
        while fs.exists(self.jvm.org.apache.hadoop.fs.Path(f"{self.root}.superseded-{n}")):
            n += 1
        dst = f"{self.root}.superseded-{n}"
        fs.rename(src, self.jvm.org.apache.hadoop.fs.Path(dst))
        return dst


# ------------------------------------------------------------------------------------- Kafka reads


def warmup_start(client_conf: dict[str, str], resume: Offsets, lookback_ms: int) -> Offsets:
    """Per partition, the first offset whose record timestamp is within ``lookback_ms`` before the
    record just before ``resume`` (Kafka's time index): where the dedup state's warm-up begins."""
    consumer = Consumer({**client_conf, "group.id": f"glasspipe-warmup-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": "false"})
    try:
        out: Offsets = {}
        for topic, parts in resume.items():
            for p, off in parts.items():
                out.setdefault(topic, {})[p] = off
                if off <= 0:
                    continue
                consumer.assign([TopicPartition(topic, p, off - 1)])
                msg = None
                for _ in range(50):
                    msg = consumer.poll(0.2)
                    if msg is not None and msg.error() is None:
                        break
                if msg is None or msg.error() is not None:
                    raise RuntimeError(f"cannot read {topic}[{p}] at offset {off - 1} to plan the dedup warm-up")
                ts = msg.timestamp()[1]
                found = consumer.offsets_for_times([TopicPartition(topic, p, max(ts - lookback_ms, 0))],
                                                   timeout=30)[0]
                out[topic][p] = off if found.offset < 0 else min(found.offset, off)
        return out
    finally:
        consumer.close()


def starting_offsets_json(offsets: Offsets) -> str:
    return json.dumps({t: {str(p): o for p, o in sorted(parts.items())} for t, parts in offsets.items()},
                      sort_keys=True)
