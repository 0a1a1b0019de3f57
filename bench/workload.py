"""Realistic keyed SMS-status events at a fixed offered rate, for the benchmarks in this folder.

Each event is ~200 bytes of JSON keyed by ``sms_id``; a configurable share are repeats of an earlier key.
Most repeats follow within seconds (a producer retry), a tail arrives up to ``max_repeat_delay`` later
(a source replay), so a deduplication window sees both. Event time (``sent_at``) is the moment the event
is produced, and ``seq`` numbers first occurrences, so a reader of the sink can tell when each row
became visible (bench/freshness.py).

Two ways to produce: ``Workload.event(now)`` makes each event when it is sent (bulk and soak runs), and
``Workload.plan(n, rate)`` makes a stream's events before it is offered, in the stream's own clock, so that
``produce_plan`` only appends each tick's ``sent_at`` and hands the bytes to the producer. At 30 000 events/s
making the JSON on the fly took most of a core of the two the pipeline runs on; a plan leaves ~3 us a record.
A plan in memory holds ~220 bytes an event (33 M events took 7.4 GB); ``spill_plan`` writes one to files in
chunks and ``produce_plan`` reads it back a chunk at a time, so a soak of 100 M events needs disk, not memory.

    python bench/workload.py --bootstrap 127.0.0.1:9092 --topic sms --rate 10000 --seconds 60
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from confluent_kafka import Producer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))

from producer_delays import STATS_INTERVAL_MS, ProducerDelays

from glasspipe_dev.pipelines import reporting_producer, require_delivered

PROVIDERS = ("twilio", "vonage", "sinch")
# Everything of a document up to its sent_at value, and what closes it: the bytes json.dumps(doc,
# separators=(",", ":")) gives for {"sms_id", "seq", "status", "phone", "meta": {"provider"}, "sent_at"}.
HEAD = '{"sms_id":"%s","seq":%d,"status":"%s","phone":"+1555%07d","meta":{"provider":"%s"},"sent_at":"'
TAIL = b'"}'


def sent_at(now: float) -> bytes:
    """``now`` as the documents carry it: ISO 8601, milliseconds, UTC offset (always 29 bytes)."""
    return datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds").encode()


@dataclass
class Plan:
    """A stream's events made ahead of time: ``heads[i] + sent_at(t) + TAIL`` is event i sent at ``t``, to
    ``topics[i]`` (bench/join_stream.py's pairs) or else to the one topic ``produce_plan`` is given. ``repeats``:
    the events that land no row of their own (a key's repeat; a pair's user event)."""

    keys: list[bytes]
    heads: list[bytes]
    repeats: int
    topics: list[str] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def chunks(self) -> Iterator[Plan]:
        """The plan as ``produce_plan`` reads it: here all at once."""
        yield self


def _drop_cached(f: BinaryIO) -> None:
    """Take a plan's file up to where it was written or read (written to disk first) out of the page cache: the
    harness's own files (14 GB in a half-hour soak), each page touched twice, would otherwise stay cached at the
    expense of what the pipeline reads again and again, its state's files. Up to there, not only the last chunk:
    a chunk's range alone left pages behind (a fifth of a file)."""
    if f.writable():
        f.flush()
        os.fdatasync(f.fileno())
    os.posix_fadvise(f.fileno(), 0, f.tell(), os.POSIX_FADV_DONTNEED)


SPILL_CHUNK = 50_000  # events a chunk of a SpilledPlan: ~7 MB, split back into lists in ~6 ms
SPILLED = ("keys", "heads", "topics")  # a SpilledPlan's files in its directory, one line an event each


@dataclass
class SpilledPlan:
    """A plan written to files (``spill_plan``), read back a chunk at a time: its events' keys, heads and (when it
    has them) topics, one line an event (none of them holds a newline). ``sizes``: each chunk's bytes in each
    file."""

    directory: Path
    sizes: list[tuple[int, int, int]]
    events: int
    repeats: int

    def __len__(self) -> int:
        return self.events

    def chunks(self) -> Iterator[Plan]:
        """Each chunk as a Plan, read when it is reached: one chunk's lists in memory at a time."""
        files = [(self.directory / name).open("rb") for name in SPILLED]
        with files[0], files[1], files[2]:
            for sizes in self.sizes:
                keys, heads, topics = (_read_chunk(f, size) for f, size in zip(files, sizes, strict=True))
                yield Plan(keys[:-1].split(b"\n"), heads[:-1].split(b"\n"), 0,
                           topics[:-1].decode().split("\n") if topics else None)


def spill_plan(make: Callable[[int], Plan], n: int, directory: Path, chunk: int = SPILL_CHUNK) -> SpilledPlan:
    """The next ``n`` events of ``make`` (a workload's ``plan`` at its rate, called for ``chunk`` events at a time:
    the same stream as one call for all ``n``) written to files in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    sizes: list[tuple[int, int, int]] = []
    repeats = 0
    files = [(directory / name).open("wb") for name in SPILLED]
    with files[0], files[1], files[2]:
        for start in range(0, n, chunk):
            part = make(min(chunk, n - start))
            repeats += part.repeats
            lines = (b"\n".join(part.keys), b"\n".join(part.heads),
                     "\n".join(part.topics).encode() if part.topics else None)
            keys, heads, topics = (_write_chunk(f, data) for f, data in zip(files, lines, strict=True))
            sizes.append((keys, heads, topics))
    return SpilledPlan(directory, sizes, n, repeats)


def _write_chunk(f: BinaryIO, lines: bytes | None) -> int:
    """A chunk's lines and a newline (nothing for None: a plan without topics), left on disk, not in the cache."""
    if lines is None:
        return 0
    size = f.write(lines + b"\n")
    _drop_cached(f)
    return size


def _read_chunk(f: BinaryIO, size: int) -> bytes:
    data = f.read(size)
    if size:
        _drop_cached(f)
    return data


@dataclass
class Workload:
    """The stream's shape; :meth:`event` yields (key, value, is_repeat) in produce order."""

    dup_share: float = 0.10
    retry_delay_s: float = 2.0  # mean delay of a quick repeat (exponential)
    tail_share: float = 0.10  # share of repeats that come late, uniformly up to max_repeat_delay_s
    max_repeat_delay_s: float = 300.0
    seed: int = 7
    # False: keys in the order they are made (s-7-000000001, s-7-000000002, ...), so each new key sorts after
    # the last and RocksDB's state writes land at the end of its key space; True: the same count of distinct
    # keys, scattered over it (a bijective hash of the number, 16 hex digits), as random ids would be
    scattered_keys: bool = False
    rng: random.Random = field(init=False)
    firsts: int = field(default=0, init=False)
    pending: list[tuple[float, str]] = field(default_factory=list, init=False)  # (due, sms_id), a heap
    clock: float = field(default=0.0, init=False)  # the stream's own clock of plan(), in seconds

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def _head(self, sms_id: str, seq: int, status: str) -> bytes:
        rng = self.rng
        return (HEAD % (sms_id, seq, status, rng.randrange(10**7), PROVIDERS[rng.randrange(3)])).encode()

    def next_head(self, now: float) -> tuple[bytes, bytes, bool]:
        """The next event at time ``now`` without its sent_at: (key, head, is_repeat). A repeat that is due
        comes first, else a new key (which is given a repeat with probability dup_share / (1 - dup_share),
        so that repeats make up dup_share)."""
        if self.pending and self.pending[0][0] <= now:
            _, sms_id = heapq.heappop(self.pending)
            return sms_id.encode(), self._head(sms_id, -1, "repeat"), True
        self.firsts += 1
        sms_id = (f"s-{self.seed}-{self.firsts * 0x9E3779B97F4A7C15 % 2**64:016x}" if self.scattered_keys
                  else f"s-{self.seed}-{self.firsts:09d}")
        if self.rng.random() < self.dup_share / (1 - self.dup_share):
            late = self.rng.random() < self.tail_share
            delay = (self.rng.uniform(0, self.max_repeat_delay_s) if late
                     else self.rng.expovariate(1 / self.retry_delay_s))
            heapq.heappush(self.pending, (now + delay, sms_id))
        return sms_id.encode(), self._head(sms_id, self.firsts, "first"), False

    def event(self, now: float) -> tuple[bytes, bytes, bool]:
        """The next event at wall time ``now``, whole: (key, value, is_repeat)."""
        key, head, repeat = self.next_head(now)
        return key, head + sent_at(now) + TAIL, repeat

    def plan(self, n: int, rate: float) -> Plan:
        """The next ``n`` events as offered at ``rate``/s, in the stream's own clock (event i at i / rate after
        the previous plan's last): the same stream as :meth:`event` at a steady rate, made before it is sent."""
        keys: list[bytes] = []
        heads: list[bytes] = []
        repeats = 0
        start = self.clock
        for i in range(n):
            key, head, repeat = self.next_head(start + i / rate)
            keys.append(key)
            heads.append(head)
            repeats += repeat
        self.clock = start + n / rate
        return Plan(keys, heads, repeats)


LINGER_MS = 5  # librdkafka's default: a produce request per partition every 5 ms at most


def _producer(bootstrap: str, linger_ms: int = LINGER_MS,
              delays: ProducerDelays | None = None) -> tuple[Producer, list[str]]:
    """The harness's producer, and the list its failed deliveries go to: a record lost on the way in must not pass
    for one the pipeline lost. ``delays`` reads librdkafka's statistics each second."""
    stats = {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": delays} if delays is not None else {}
    return reporting_producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms, "enable.idempotence": True,
                               "queue.buffering.max.messages": 1_000_000, **stats})


def _send(producer: Producer, topic: str, value: bytes, key: bytes) -> None:
    while True:
        try:
            producer.produce(topic, value, key)
            return
        except BufferError:
            producer.poll(0.01)


def produce_plan(bootstrap: str, topic: str, plan: Plan | SpilledPlan, rate: float,
                 linger_ms: int = LINGER_MS) -> dict[str, Any]:
    """Offer ``plan``'s events at ``rate`` events/s (paced every 5 ms); each tick's events carry that tick's
    wall time as sent_at. Returns what was achieved, and the CPU seconds this process spent meanwhile (the
    producer and whatever else runs in it, e.g. a poller thread). A longer ``linger_ms`` sends fewer, larger
    produce requests: less CPU for this process and the broker (45 000/s for 30 s, no consumer, 5 -> 50 ms:
    this process 0.10 -> 0.09 cores, the broker 0.20 -> 0.12), and a record waits up to that long in the
    producer, which the latencies measured from ``sent_at`` include: ``producer`` in the result bounds how long
    records took to reach the broker (producer_delays.py)."""
    delays = ProducerDelays()
    producer, failed = _producer(bootstrap, linger_ms, delays)
    n = len(plan)
    parts = ((part.keys, part.heads, part.topics or [topic] * len(part)) for part in plan.chunks())
    keys: list[bytes] = []
    heads: list[bytes] = []
    topics: list[str] = []
    base = 0  # the stream's index of the chunk's first event
    cpu0 = time.process_time()
    start = time.monotonic()
    sent = 0
    while sent < n:
        due = min(n, int((time.monotonic() - start) * rate))
        if due > sent:
            tail = sent_at(time.time()) + TAIL
            while sent < due:
                if sent == base + len(keys):
                    base, (keys, heads, topics) = sent, next(parts)
                end = min(due, base + len(keys))
                for i in range(sent - base, end - base):
                    _send(producer, topics[i], heads[i] + tail, keys[i])
                sent = end
        producer.poll(0)
        time.sleep(0.005)
    require_delivered(producer, failed, n)
    took = time.monotonic() - start
    return {"events": n, "repeats": plan.repeats, "firsts": n - plan.repeats, "seconds": took, "rate": n / took,
            "cpu": time.process_time() - cpu0, "producer": delays.as_record()}


def fill(bootstrap: str, topic: str, plan: Plan, linger_ms: int = 50, timeout_s: float = 120) -> None:
    """Append all of ``plan``'s events as fast as the producer takes them, all with one sent_at (a topic to read
    afterwards, not a paced stream: produce_plan); raises unless every one was delivered within ``timeout_s``."""
    producer, failed = _producer(bootstrap, linger_ms)
    tail = sent_at(time.time()) + TAIL
    for key, head in zip(plan.keys, plan.heads, strict=True):
        _send(producer, topic, head + tail, key)
    require_delivered(producer, failed, len(plan), timeout_s)


def _main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--rate", type=float, default=1000)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--dup-share", type=float, default=0.10)
    args = p.parse_args()
    workload = Workload(dup_share=args.dup_share)
    plan = workload.plan(int(args.rate * args.seconds), args.rate)
    got = produce_plan(args.bootstrap, args.topic, plan, args.rate)
    print(f"produced {got['events']:.0f} events ({got['repeats']:.0f} repeats) in {got['seconds']:.1f} s: "
          f"{got['rate']:.0f} events/s offered, {got['cpu']:.1f} CPU-s")


if __name__ == "__main__":
    _main()
