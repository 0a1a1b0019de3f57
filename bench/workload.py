"""Realistic keyed SMS-status events at a fixed offered rate, for the benchmarks in this folder.

Each event is ~200 bytes of JSON keyed by ``sms_id``; a configurable share are repeats of an earlier key.
Most repeats follow within seconds (a producer retry), a tail arrives up to ``max_repeat_delay`` later
(a source replay), so a deduplication window sees both. Event time (``sent_at``) is the moment the event
is produced, and ``seq`` numbers first occurrences, so a reader of the sink can tell when each row
became visible (bench/freshness.py).

    python bench/workload.py --bootstrap 127.0.0.1:9092 --topic sms --rate 10000 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from confluent_kafka import Producer


@dataclass
class Workload:
    """The stream's shape; :meth:`events` yields (key, value, is_repeat) in produce order."""

    dup_share: float = 0.10
    retry_delay_s: float = 2.0  # mean delay of a quick repeat (exponential)
    tail_share: float = 0.10  # share of repeats that come late, uniformly up to max_repeat_delay_s
    max_repeat_delay_s: float = 300.0
    seed: int = 7
    rng: random.Random = field(init=False)
    firsts: int = field(default=0, init=False)
    pending: list[tuple[float, str]] = field(default_factory=list, init=False)  # (due, sms_id), a heap

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def _doc(self, sms_id: str, seq: int, status: str, now: float) -> bytes:
        doc = {"sms_id": sms_id, "seq": seq, "status": status, "phone": f"+1555{self.rng.randrange(10**7):07d}",
               "meta": {"provider": self.rng.choice(("twilio", "vonage", "sinch"))},
               "sent_at": datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")}
        return json.dumps(doc, separators=(",", ":")).encode()

    def event(self, now: float) -> tuple[bytes, bytes, bool]:
        """The next event at wall time ``now``: a repeat that is due, else a new key (which is given a
        repeat with probability dup_share / (1 - dup_share), so that repeats make up dup_share)."""
        import heapq

        if self.pending and self.pending[0][0] <= now:
            _, sms_id = heapq.heappop(self.pending)
            return sms_id.encode(), self._doc(sms_id, -1, "repeat", now), True
        self.firsts += 1
        sms_id = f"s-{self.seed}-{self.firsts:09d}"
        if self.rng.random() < self.dup_share / (1 - self.dup_share):
            late = self.rng.random() < self.tail_share
            delay = (self.rng.uniform(0, self.max_repeat_delay_s) if late
                     else self.rng.expovariate(1 / self.retry_delay_s))
            heapq.heappush(self.pending, (now + delay, sms_id))
        return sms_id.encode(), self._doc(sms_id, self.firsts, "first", now), False


def produce_at_rate(bootstrap: str, topic: str, workload: Workload, rate: float, seconds: float) -> dict[str, float]:
    """Produce for ``seconds`` at ``rate`` events/s (paced every 10 ms); returns what was achieved."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                         "queue.buffering.max.messages": 1_000_000})
    start = time.monotonic()
    wall0 = time.time()
    sent = repeats = 0
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate)
        while sent < due:
            key, value, repeat = workload.event(wall0 + elapsed)
            while True:
                try:
                    producer.produce(topic, value, key)
                    break
                except BufferError:
                    producer.poll(0.01)
            sent += 1
            repeats += repeat
        producer.poll(0)
        time.sleep(0.01)
    producer.flush(60)
    took = time.monotonic() - start
    return {"events": sent, "repeats": repeats, "firsts": sent - repeats, "seconds": took, "rate": sent / took}


def _main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--rate", type=float, default=1000)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--dup-share", type=float, default=0.10)
    args = p.parse_args()
    got = produce_at_rate(args.bootstrap, args.topic, Workload(dup_share=args.dup_share), args.rate, args.seconds)
    print(f"produced {got['events']:.0f} events ({got['repeats']:.0f} repeats) in {got['seconds']:.1f} s: "
          f"{got['rate']:.0f} events/s offered")


if __name__ == "__main__":
    _main()
