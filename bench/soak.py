"""Soak: minutes of steady input through the sms-dedup pipeline while faults are injected, then an exact check.

Starts its own Kafka and ClickHouse (tests' server classes), produces keyed SMS events at a steady
rate (bench/workload.py: 10 % repeats, most within seconds, a tail up to 4 minutes later) with
malformed and far-future records mixed in, and runs the pipeline as `glasspipe run --replica i
--replicas n` processes (one Spark driver each, as each would be its own SparkApplication). A
supervisor restarts any replica that exits, as spark-operator's restart policy would. Meanwhile:

- random SIGKILLs of a replica (restarted a few seconds later),
- ClickHouse stopped for 15 s, twice, and Kafka stopped for 30 s, once,
- a rescale 2 -> 3 and later 3 -> 2 (all replicas stopped, the new layout started on the same
  checkpoint root, as the operator does).

At the end the producer stops, the replicas drain the topic (consumer-group lag 0) and stop, and
the script reads the whole input topic back and checks, record by record:

- every malformed record is in the dead-letter topic with reason malformed_json, every far-future
  one with event_time_in_future, any other dead letter has reason late;
- ClickHouse holds exactly one row per key that has a record not dead-lettered, and nothing else;
- dead letters repeated by their at-least-once delivery are counted apart (docs/semantics.md).

It prints a table (events in, rows, dead letters per reason, faults injected) and exits 1 on any
mismatch; then, from the consumer group's lag read every 2 s, each fault's peak lag and how long the group took
to be back within 3 s of input (soak_recovery.py).

    python bench/soak.py --minutes 20 --rate 300
    python bench/soak.py --minutes 15 --rate 2000 --engine own-state
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from confluent_kafka import Consumer, Producer, TopicPartition
from soak_recovery import recoveries, recovery_table
from workload import Workload

from glasspipe.contract import default_consumer_group
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import group_lag, sms_dedup_pipeline, start_continuous
from glasspipe_dev.process import ServerProcess

PARTITIONS = 6
MALFORMED_EVERY = 400  # one broken record per this many events
FUTURE_EVERY = 700  # one far-future record (year 2099) per this many events
RECOVERED_S = 3.0  # a group within this many seconds of input has caught up (a 1 s trigger, a batch, its commit)


@dataclass
class Faults:
    replica_kills: int = 0
    replica_exits: int = 0  # replicas that stopped by themselves and were restarted
    clickhouse_down: list[float] = field(default_factory=list)  # seconds each outage lasted
    kafka_down: list[float] = field(default_factory=list)
    rescales: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    marks: list[tuple[float, str]] = field(default_factory=list)  # each fault: seconds from the start, what

    def note(self, t0: float, what: str, fault: bool = False) -> None:
        at = time.monotonic() - t0
        line = f"{at:7.1f} s  {what}"
        self.log.append(line)
        if fault:
            self.marks.append((at, what.splitlines()[0].rstrip(":")))  # a replica's exit has its log below
        print(line, flush=True)


class LagWatch(threading.Thread):
    """The consumer group's lag every ``every`` seconds, apart from the fault loop (a lag read waits while Kafka
    is down); samples where Kafka did not answer are left out."""

    def __init__(self, kafka: KafkaServer, group: str, topic: str, t0: float, every: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.kafka, self.group, self.topic, self.t0, self.every = kafka, group, topic, t0, every
        self.samples: list[tuple[float, int]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(self.every):
            behind = lag(self.kafka, self.group, self.topic)
            if behind is not None:
                self.samples.append((time.monotonic() - self.t0, behind))


class Producing(threading.Thread):
    """Steady input at ``rate`` events/s until stopped; malformed and far-future records mixed in."""

    def __init__(self, bootstrap: str, topic: str, rate: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.topic, self.rate = topic, rate
        self.workload = Workload(dup_share=0.10, max_repeat_delay_s=240.0, seed=seed)
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                                  "queue.buffering.max.messages": 1_000_000, "message.timeout.ms": 600_000})
        self.stop_event = threading.Event()
        self.sent = 0
        self.failed: list[str] = []

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))

    def _send(self, key: bytes, value: bytes) -> None:
        while True:
            try:
                self.producer.produce(self.topic, value, key, on_delivery=self._delivered)
                return
            except BufferError:
                self.producer.poll(0.01)

    def run(self) -> None:
        start, wall0 = time.monotonic(), time.time()
        while not self.stop_event.is_set():
            elapsed = time.monotonic() - start
            while self.sent < int(elapsed * self.rate):
                self.sent += 1
                if self.sent % MALFORMED_EVERY == 0:
                    self._send(f"bad-{self.sent}".encode(), f'{{"sms_id": "bad-{self.sent}", broken'.encode())
                elif self.sent % FUTURE_EVERY == 0:
                    future = f"future-{self.sent}"
                    doc = {"sms_id": future, "seq": -2, "status": "future", "phone": "+1",
                           "meta": {"provider": "p"}, "sent_at": "2099-01-01T00:00:00.000+00:00"}
                    self._send(future.encode(), json.dumps(doc).encode())
                else:
                    key, value, _ = self.workload.event(wall0 + elapsed)
                    self._send(key, value)
            self.producer.poll(0)
            time.sleep(0.01)
        if self.producer.flush(600) != 0:
            self.failed.append("records left undelivered at the end")


class Replicas:
    """The running layout: ``n`` replica processes on one checkpoint root; restarts those that exit."""

    def __init__(self, tmp: Path, path: Path, kafka: KafkaServer, ch: ClickHouseServer, faults: Faults,
                 t0: float) -> None:
        self.tmp, self.path, self.kafka, self.ch, self.faults, self.t0 = tmp, path, kafka, ch, faults, t0
        self.n = 0
        self.procs: list[ServerProcess] = []
        self.starts = 0
        self.lock = threading.Lock()

    def _start_one(self, i: int) -> ServerProcess:
        self.starts += 1
        log = self.tmp / f"replica-{i}of{self.n}-{self.starts}.log"
        return start_continuous(self.path, self.kafka.bootstrap, f"127.0.0.1:{self.ch.port}", self.tmp / "ckpt", log,
                                "--replica", str(i), "--replicas", str(self.n))

    def start(self, n: int) -> None:
        with self.lock:
            self.n = n
            self.procs = [self._start_one(i) for i in range(n)]

    def stop_all(self) -> None:
        with self.lock:
            for p in self.procs:
                p.stop(timeout=90)
            self.procs = []

    def rescale(self, n: int) -> None:
        old = self.n
        self.faults.note(self.t0, f"rescaling {old} -> {n}", fault=True)
        self.stop_all()
        self.start(n)
        self.faults.rescales.append(f"{old} -> {n}")
        self.faults.note(self.t0, f"rescaled {old} -> {n}")

    def kill_one(self, rng: random.Random) -> None:
        with self.lock:
            if not self.procs:
                return
            i = rng.randrange(len(self.procs))
            self.procs[i].kill()
        self.faults.replica_kills += 1
        self.faults.note(self.t0, f"SIGKILL replica {i} of {self.n}", fault=True)
        time.sleep(rng.uniform(2, 6))
        with self.lock:
            if self.procs and not self.procs[i].alive():
                self.procs[i] = self._start_one(i)

    def supervise(self) -> None:
        """Restart a replica that exited by itself (spark-operator's restart policy)."""
        with self.lock:
            for i, p in enumerate(self.procs):
                if not p.alive():
                    self.faults.replica_exits += 1
                    self.faults.note(self.t0, f"replica {i} of {self.n} exited by itself; restarted:\n"
                                     + p.log_tail(8), fault=True)
                    self.procs[i] = self._start_one(i)


def outage(server: KafkaServer | ClickHouseServer, seconds: float, what: str, faults: Faults, t0: float) -> float:
    """Stop a server (SIGTERM; a shutdown that hangs is killed), keep it down ``seconds`` after it stopped,
    start it again; returns how long its port was closed to clients (from the stop signal to ready)."""
    began = time.monotonic()
    faults.note(t0, f"{what} stopping", fault=True)
    server.stop()
    faults.note(t0, f"{what} stopped")
    time.sleep(seconds)
    server.start()
    down = time.monotonic() - began
    faults.note(t0, f"{what} started again (down {down:.0f} s)")
    return down


ENGINES = ("default", "own-state", "per-kafka-partition")  # deduplication's engines (docs/semantics.md)


def pipeline(tmp: Path, topic: str, name: str, engine: str) -> Path:
    """The sms-dedup pipeline with ``engine``'s deduplication; the producer keys records by ``sms_id``, so a
    topic partitioned by the key, as ``perKafkaPartition`` requires."""
    return sms_dedup_pipeline(tmp, name, topic, max_offsets=20_000, max_rows=5_000,
                              own_state=engine == "own-state", per_kafka_partition=engine == "per-kafka-partition")


def lag(kafka: KafkaServer, group: str, topic: str) -> int | None:
    try:
        return sum(max(0, end - max(c, 0)) for c, end in group_lag(kafka.bootstrap, group, topic).values())
    except Exception:  # the broker is restarting
        return None


def read_topic(bootstrap: str, topic: str) -> list[Any]:
    """Every record of every partition, from the beginning to the end offsets of now."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"soak-reader-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        parts = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Any] = []
        seen = dict.fromkeys(parts, 0)
        deadline = time.monotonic() + 300
        while any(seen[p] < ends[p] for p in parts) and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error() is None:
                    out.append(msg)
                    seen[msg.partition()] = int(msg.offset() or 0) + 1
        if any(seen[p] < ends[p] for p in parts):
            raise RuntimeError(f"could not read {topic} to its end: {seen} of {ends}")
        return out
    finally:
        consumer.close()


def expected_kind(value: bytes) -> str:
    """What should become of an input record: malformed, future, or ok (written or deduplicated)."""
    try:
        doc = json.loads(value)
    except ValueError:
        return "malformed_json"
    return "event_time_in_future" if str(doc.get("sent_at", "")).startswith("2099") else "ok"


def check(kafka: KafkaServer, ch: ClickHouseServer, topic: str, table: str) -> tuple[bool, dict[str, Any]]:
    inputs = read_topic(kafka.bootstrap, topic)
    dead = read_topic(kafka.bootstrap, f"{topic}-dlq")
    by_coord: dict[tuple[int, int], str] = {}
    repeated = 0
    for m in dead:
        h = {k: v.decode() for k, v in m.headers()}
        coord = (int(h["glasspipe.source.partition"]), int(h["glasspipe.source.offset"]))
        if coord in by_coord:
            repeated += 1
        by_coord[coord] = h["glasspipe.reason"].split(":")[0]
    problems: list[str] = []
    kinds: Counter[str] = Counter()
    keys_expected: set[str] = set()
    firsts = repeats = 0
    for m in inputs:
        kind = expected_kind(m.value())
        kinds[kind] += 1
        got = by_coord.get((m.partition(), m.offset()))
        if kind != "ok":
            if got != kind:
                problems.append(f"{kind} record {m.partition()}/{m.offset()}: dead letter {got!r}")
            continue
        doc = json.loads(m.value())
        firsts += doc["status"] == "first"
        repeats += doc["status"] == "repeat"
        if got is None:
            keys_expected.add(doc["sms_id"])
        elif got != "late":
            problems.append(f"good record {m.partition()}/{m.offset()} dead-lettered as {got}")
    input_coords = {(m.partition(), m.offset()) for m in inputs}
    strays = [c for c in by_coord if c not in input_coords]
    if strays:
        problems.append(f"{len(strays)} dead letters point at no input record")
    client = ch.client()
    rows, distinct = client.execute(f"SELECT count(), uniqExact(sms_id) FROM {table}")[0]
    landed = {r[0] for r in client.execute(f"SELECT DISTINCT sms_id FROM {table}")}
    if rows != distinct:
        problems.append(f"{rows - distinct} duplicate rows in ClickHouse")
    if landed != keys_expected:
        problems.append(f"ClickHouse keys: {len(landed - keys_expected)} unexpected, "
                        f"{len(keys_expected - landed)} missing")
    per_reason = Counter(by_coord.values())
    report = {"input records": len(inputs), "first occurrences": firsts, "repeats": repeats,
              "malformed in": kinds["malformed_json"], "far-future in": kinds["event_time_in_future"],
              "rows in ClickHouse": rows, "distinct keys in ClickHouse": distinct,
              "keys expected": len(keys_expected), "dead letters per reason": dict(sorted(per_reason.items())),
              "dead letters repeated (at-least-once)": repeated, "problems": problems[:20]}
    return not problems, report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=300.0, help="events/s offered")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--kill-every", type=float, default=75.0, help="mean seconds between replica SIGKILLs")
    parser.add_argument("--engine", choices=ENGINES, default="default",
                        help="deduplication's engine: the default, deduplication.ownState or .perKafkaPartition")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    duration = args.minutes * 60
    faults = Faults()
    with (tempfile.TemporaryDirectory(prefix="gp-soak-") as tmp_s, KafkaServer(long_running=True) as kafka,
          ClickHouseServer() as ch):
        tmp = Path(tmp_s)
        name = f"soak-{uuid.uuid4().hex[:6]}"
        topic = name
        kafka.create_topic(topic, PARTITIONS)
        kafka.create_topic(f"{topic}-dlq", 1)
        path = pipeline(tmp, topic, name, args.engine)
        group = default_consumer_group("default", name)
        t0 = time.monotonic()
        producing = Producing(kafka.bootstrap, topic, args.rate, args.seed)
        producing.start()
        watch = LagWatch(kafka, group, topic, t0)
        watch.start()
        replicas = Replicas(tmp, path, kafka, ch, faults, t0)
        replicas.start(2)
        faults.note(t0, f"started: 2 replicas, {args.rate:.0f} events/s for {args.minutes:g} min")
        plan = sorted([
            (0.20 * duration, "clickhouse"), (0.35 * duration, "rescale-up"), (0.50 * duration, "kafka"),
            (0.65 * duration, "rescale-down"), (0.80 * duration, "clickhouse"),
        ])
        next_kill = t0 + rng.expovariate(1 / args.kill_every) + 30
        try:
            while (now := time.monotonic()) - t0 < duration or plan:  # every planned fault happens
                if plan and now - t0 >= plan[0][0]:
                    _, what = plan.pop(0)
                    if what == "clickhouse":
                        faults.clickhouse_down.append(outage(ch, 15, "ClickHouse", faults, t0))
                    elif what == "kafka":
                        faults.kafka_down.append(outage(kafka, 30, "Kafka", faults, t0))
                    elif what == "rescale-up":
                        replicas.rescale(3)
                    else:
                        replicas.rescale(2)
                elif now >= next_kill:
                    replicas.kill_one(rng)
                    next_kill = time.monotonic() + rng.expovariate(1 / args.kill_every) + 20
                replicas.supervise()
                time.sleep(1.0)
            producing.stop_event.set()
            producing.join(900)
            faults.note(t0, f"input stopped after {producing.sent} events; draining")
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline:
                replicas.supervise()
                if lag(kafka, group, topic) == 0:
                    break
                time.sleep(2.0)
            time.sleep(5)  # the last batch's rows are committed before its offsets: nothing is in flight now
            faults.note(t0, f"consumer-group lag {lag(kafka, group, topic)}; stopping the replicas")
        finally:
            watch.stop_event.set()
            replicas.stop_all()
        elapsed = time.monotonic() - t0
        found = recoveries(faults.marks, watch.samples, int(RECOVERED_S * args.rate), elapsed)
        behind = sorted(n for _, n in watch.samples)
        median_lag = behind[len(behind) // 2] if behind else 0
        ok, report = check(kafka, ch, topic, name.replace("-", "_"))
        if producing.failed:
            ok = False
            report["problems"] = [*report["problems"], f"producer: {producing.failed[:3]}"]
        rows = [
            ("duration", f"{args.minutes:g} min of input, {elapsed / 60:.1f} min in all (with the drain)"),
            ("offered rate", f"{args.rate:.0f} events/s"),
            ("deduplication engine", args.engine),
            ("events in (input topic)", f"{report['input records']}: {report['first occurrences']} first "
             f"occurrences, {report['repeats']} repeats, {report['malformed in']} malformed, "
             f"{report['far-future in']} far-future"),
            ("rows in ClickHouse", f"{report['rows in ClickHouse']} ({report['distinct keys in ClickHouse']} distinct "
             f"keys; expected {report['keys expected']})"),
            *[(f"dead letters: {k}", str(v)) for k, v in report["dead letters per reason"].items()],
            ("dead letters repeated (at-least-once)", str(report["dead letters repeated (at-least-once)"])),
            ("replica SIGKILLs", str(faults.replica_kills)),
            ("replicas that exited by themselves (restarted)", str(faults.replica_exits)),
            ("ClickHouse restarts", f"{len(faults.clickhouse_down)} (down "
             f"{', '.join(f'{d:.0f}' for d in faults.clickhouse_down)} s: stop, 15 s, start)"),
            ("Kafka restarts", f"{len(faults.kafka_down)} (down {', '.join(f'{d:.0f}' for d in faults.kafka_down)} s: "
             "stop, 30 s, start)"),
            ("rescales", ", ".join(faults.rescales)),
            ("consumer-group lag, every 2 s", f"median {median_lag} records ({median_lag / args.rate:.1f} s of input), "
             f"peak {behind[-1] if behind else 0}"),
            ("exact", "yes" if ok else "NO: " + "; ".join(report["problems"])),
        ]
        print()
        print("| what | value |")
        print("|---|---|")
        for k, v in rows:
            print(f"| {k} | {v} |")
        print()
        print("\n".join(recovery_table(found, RECOVERED_S)))
        print()
        print(f"finished {datetime.now(UTC).isoformat(timespec='seconds')}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
