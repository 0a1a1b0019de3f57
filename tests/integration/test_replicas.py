"""Parallel replicas on one consumer group, and rescaling without loss or duplicates (real servers;
each replica is its own `glasspipe run` process, as each would be its own SparkApplication)."""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from glasspipe.contract import default_consumer_group
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.kafka import KafkaServer
from glasspipe_dev.pipelines import dumps, group_lag, load_example, produce, start_continuous, write_pipeline
from glasspipe_dev.process import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("jvm_ops_jar", "spark_jars")]
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
PARTITIONS = 6


class Stream:
    """A keyed SMS stream on a 6-partition topic with a pipeline, and what ClickHouse should end with."""

    def __init__(self, tmp_path: Path, kafka: KafkaServer, ch: ClickHouseServer, engine: str = "by-key",
                 partitions: int = PARTITIONS, starting_offsets: str = "earliest") -> None:
        self.started: list[ServerProcess] = []
        STREAMS.append(self)
        suffix = uuid.uuid4().hex[:8]
        self.kafka, self.ch, self.tmp = kafka, ch, tmp_path
        self.name, self.topic, self.table = f"rep-{suffix}", f"rep-{suffix}", f"rep_{suffix}"
        self.group = default_consumer_group("default", self.name)  # `glasspipe run`'s namespace is "default"
        kafka.create_topic(self.topic, partitions)
        kafka.create_topic(f"{self.topic}-dlq", 1)
        doc = load_example("sms-dedup.yaml")
        doc["metadata"]["name"] = self.name
        spec = doc["spec"]
        spec["sources"][0]["kafka"]["topic"] = self.topic
        spec["sources"][0]["kafka"]["maxOffsetsPerTrigger"] = 3000
        spec["sources"][0]["kafka"]["startingOffsets"] = starting_offsets
        if engine == "per-kafka-partition":  # the stream is keyed by sms_id
            spec["sources"][0]["deduplication"]["perKafkaPartition"] = True
        elif engine == "own-state":
            spec["sources"][0]["deduplication"]["ownState"] = True
        spec["sink"]["clickhouse"]["table"] = self.table
        spec["sink"]["clickhouse"]["batching"] = {"maxRows": 5000, "maxDelay": "500ms"}
        spec["deadLetter"]["topic"] = f"{self.topic}-dlq"
        self.path = write_pipeline(doc, tmp_path)
        self.checkpoint = tmp_path / "ckpt"
        self.firsts: dict[str, str] = {}  # sms_id -> status of its first occurrence
        self.rng = random.Random(11)
        self.clock = 0  # ms of event time, increasing
        self.malformed = 0  # records that are not JSON: one dead letter each

    def produce(self, new: int, repeats: int, malformed: int = 0) -> None:
        """``new`` fresh keys, then ``repeats`` repeats of random known keys a few seconds later, then
        ``malformed`` records that are not JSON."""
        records = []
        for _ in range(new):
            sms_id = f"k-{len(self.firsts):07d}"
            self.clock += 5
            status = f"first-{self.rng.randrange(1000)}"
            self.firsts[sms_id] = status
            records.append(self._sms(sms_id, status, self.clock))
        known = list(self.firsts)
        for _ in range(repeats):
            self.clock += 1
            records.append(self._sms(self.rng.choice(known), "repeat", self.clock))
        for _ in range(malformed):
            self.malformed += 1
            records.append((f"bad-{self.malformed}".encode(), b"{not json"))
        produce(self.kafka.bootstrap, self.topic, records)

    def dead_letters(self) -> int:
        """Records in the dead-letter topic (one partition, no transactions: its end offset)."""
        consumer = Consumer({"bootstrap.servers": self.kafka.bootstrap, "group.id": f"dlq-{uuid.uuid4().hex[:6]}"})
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(f"{self.topic}-dlq", 0), timeout=10)
            return int(high - low)
        finally:
            consumer.close()

    def _sms(self, sms_id: str, status: str, ms: int) -> tuple[bytes, bytes]:
        doc = {"sms_id": sms_id, "status": status, "phone": "+1", "meta": {"provider": "p"},
               "sent_at": (T0 + timedelta(milliseconds=ms)).isoformat()}
        return sms_id.encode(), dumps(doc)

    def start(self, replicas: int, replica: int, env: dict[str, str] | None = None) -> ServerProcess:
        job = start_continuous(self.path, self.kafka.bootstrap, f"127.0.0.1:{self.ch.port}", self.checkpoint,
                                self.tmp / f"r{replica}of{replicas}.log", "--replica", str(replica),
                                "--replicas", str(replicas), env=env)
        self.started.append(job)
        return job

    def offsets(self) -> dict[int, tuple[int, int]]:
        """Partition -> (the group's committed offset, the end offset)."""
        return group_lag(self.kafka.bootstrap, self.group, self.topic)

    def lag(self) -> int:
        return lag_of(self.offsets())

    def wait_drained(self, jobs: list[ServerProcess], timeout: float = 300) -> float:
        """Until the group's lag is 0 (every replica committed up to the end): returns seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            for job in jobs:
                assert job.alive(), f"a replica died:\n{job.log_tail(80)}"
            if self.lag() == 0:
                return time.monotonic() - start
            time.sleep(0.5)
        raise AssertionError(f"lag still {self.lag()} after {timeout} s:\n" + "\n".join(j.log_tail(30) for j in jobs))

    def assert_exact(self) -> None:
        rows = self.ch.client().execute(f"SELECT sms_id, status FROM {self.table}")
        got: dict[str, list[str]] = {}
        for sms_id, status in rows:
            got.setdefault(sms_id, []).append(status)
        doubled = {k: v for k, v in got.items() if len(v) > 1}
        missing = set(self.firsts) - set(got)
        wrong = {k: v for k, v in got.items() if k in self.firsts and v[0] != self.firsts[k]}
        assert not doubled and not missing and not wrong and len(got) == len(self.firsts), (
            f"{len(rows)} rows for {len(self.firsts)} keys; doubled {list(doubled.items())[:5]}, "
            f"missing {sorted(missing)[:5]}, not the first payload {list(wrong.items())[:5]}")


def lag_of(offsets: dict[int, tuple[int, int]]) -> int:
    """Records between the group's committed offsets and the ends (Stream.offsets)."""
    return sum(max(0, end - max(c, 0)) for c, end in offsets.values())


STREAMS: list[Stream] = []


@pytest.fixture(autouse=True)
def _no_replica_outlives_its_test() -> Iterator[None]:
    """A test that fails mid-rescale leaves its other replicas running: a CI run left two for the rest of the
    suite. Whatever a test started is stopped when it ends."""
    yield
    while STREAMS:
        stop_all(STREAMS.pop().started)


def stop_all(jobs: list[ServerProcess]) -> None:
    for job in jobs:
        job.stop(timeout=60)


@pytest.mark.parametrize("replicas", [2, 3])
def test_replicas_share_the_topic_and_group(replicas: int, tmp_path: Path, kafka: KafkaServer,
                                            clickhouse: ClickHouseServer) -> None:
    s = Stream(tmp_path, kafka, clickhouse)
    s.produce(new=8_000, repeats=2_000)
    jobs = [s.start(replicas, i) for i in range(replicas)]
    try:
        waited = s.wait_drained(jobs)
    finally:
        stop_all(jobs)
    print(f"{replicas} replicas drained 10000 events in {waited:.1f} s (incl. Spark start-up)")
    s.assert_exact()
    assert s.lag() == 0
    logs = [(tmp_path / f"r{i}of{replicas}.log").read_text() for i in range(replicas)]
    owned = [sorted(int(p) for p in range(PARTITIONS) if p % replicas == i) for i in range(replicas)]
    for i, log in enumerate(logs):  # each replica read exactly its own partitions
        assert f"partitions {owned[i]}" in log, log[-2000:]


@pytest.mark.parametrize("engine", ["by-key", "own-state", "per-kafka-partition"])
def test_rescale_1_3_2_with_a_replica_killed_during_the_rescale(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer, engine: str
) -> None:
    s = Stream(tmp_path, kafka, clickhouse, engine)
    timings: dict[str, Any] = {}
    # 1 replica
    s.produce(new=6_000, repeats=1_000)
    jobs = [s.start(1, 0)]
    s.wait_drained(jobs)
    s.produce(new=2_000, repeats=2_000)  # repeats of keys written by replica 0 of 1
    time.sleep(1.0)
    stop_all(jobs)  # stop-first, possibly mid-batch
    # 3 replicas: they take over where the ledger says, and rebuild dedup state from the window
    started = time.monotonic()
    jobs = [s.start(3, i) for i in range(3)]
    s.produce(new=2_000, repeats=3_000)
    time.sleep(random.Random(3).uniform(8, 15))
    jobs[1].kill()  # a replica SIGKILLed during the rescale ...
    jobs[1] = s.start(3, 1)  # ... and restarted (spark-operator's restartPolicy: Always)
    s.wait_drained(jobs)
    timings["1->3 drained"] = time.monotonic() - started
    s.produce(new=1_000, repeats=2_000)
    time.sleep(1.0)
    stop_all(jobs)
    # 2 replicas: replica 0 of 2 and 1 of 2 take partitions from all three
    started = time.monotonic()
    jobs = [s.start(2, i) for i in range(2)]
    s.produce(new=1_000, repeats=3_000)
    s.wait_drained(jobs)
    timings["3->2 drained"] = time.monotonic() - started
    stop_all(jobs)
    print("rescale timings (s):", {k: round(v, 1) for k, v in timings.items()})
    s.assert_exact()
    warmups = [line for f in tmp_path.glob("r*of*.log") for line in f.read_text().splitlines()
               if "new checkpoint" in line]
    assert any("read from" in w for w in warmups)


def test_a_latest_pipeline_reads_partitions_added_while_it_rescaled_from_their_start(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """startingOffsets: latest reads what is appended from the writer's start (its claim) on. The topic grows
    from 2 to 4 partitions while the pipeline is stopped for a rescale (1 -> 2 replicas): the new writers read the
    added partitions from their start, as Spark's Kafka source reads partitions it discovers. (A new writer used
    to start them at "latest" too, and every record appended to them before it started was lost.)"""
    s = Stream(tmp_path, kafka, clickhouse, partitions=2, starting_offsets="latest")
    s.produce(new=500, repeats=0)  # before the pipeline's first start: not read
    s.firsts.clear()
    jobs = [s.start(1, 0)]
    deadline = time.monotonic() + 180
    while "claims" not in (tmp_path / "r0of1.log").read_text():
        assert jobs[0].alive() and time.monotonic() < deadline, jobs[0].log_tail(60)
        time.sleep(0.2)
    s.produce(new=1_000, repeats=300)
    s.wait_drained(jobs)
    stop_all(jobs)
    kafka.add_partitions(s.topic, 4)
    s.produce(new=2_000, repeats=0)  # keys move to other partitions now: no repeat of the first 1 000 keys
    jobs = [s.start(2, i) for i in range(2)]
    s.wait_drained(jobs)
    stop_all(jobs)
    s.assert_exact()
    offsets = s.offsets()
    assert sum(end for p, (_c, end) in offsets.items() if p >= 2) > 500, offsets  # the added partitions' records


def test_running_replicas_read_partitions_added_to_the_topic_from_their_start(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """Two replicas run while the topic grows from 2 to 4 partitions: each restarts its query in place on its own
    checkpoint, which names only its old partition; Spark's Kafka source (``assign``) reads the partition added to
    it from its start, with startingOffsets: latest too."""
    s = Stream(tmp_path, kafka, clickhouse, partitions=2, starting_offsets="latest")
    jobs = [s.start(2, i, env={"GLASSPIPE_PARTITION_CHECK_SECONDS": "2"}) for i in range(2)]
    deadline = time.monotonic() + 180
    while not all("claims" in (tmp_path / f"r{i}of2.log").read_text() for i in range(2)):
        assert all(j.alive() for j in jobs) and time.monotonic() < deadline, [j.log_tail(40) for j in jobs]
        time.sleep(0.2)
    s.produce(new=1_000, repeats=300)
    s.wait_drained(jobs)
    kafka.add_partitions(s.topic, 4)
    s.produce(new=2_000, repeats=0)  # keys move to other partitions now: no repeat of the first 1 000 keys
    deadline = time.monotonic() + 120
    while not all("partitions owned changed" in (tmp_path / f"r{i}of2.log").read_text() for i in range(2)):
        assert all(j.alive() for j in jobs) and time.monotonic() < deadline, [j.log_tail(40) for j in jobs]
        time.sleep(0.5)
    s.wait_drained(jobs)
    stop_all(jobs)
    s.assert_exact()
    offsets = s.offsets()
    assert sum(end for p, (_c, end) in offsets.items() if p >= 2) > 500, offsets  # the added partitions' records
    for i in range(2):  # each writer claims the partition it took on, so a newer writer's claim of it fences it
        log = (tmp_path / f"r{i}of2.log").read_text()
        assert f"claims {{'{s.topic}': [{i}, {i + 2}]}}" in log[log.index("partitions owned changed"):], log[-3000:]


def test_the_group_never_moves_back_while_a_new_layout_warms_up(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """1 -> 2 replicas: each new replica re-reads the dedup window before where it resumes, in batches of 3 000
    records that end before it. The group's committed offsets, which tools read as the pipeline's progress (lag
    exporters, autoscalers), stay at or past where the first layout left them all the while."""
    s = Stream(tmp_path, kafka, clickhouse)
    s.produce(new=15_000, repeats=3_000)
    jobs = [s.start(1, 0)]
    try:
        s.wait_drained(jobs)
    finally:
        stop_all(jobs)
    left = {p: committed for p, (committed, _) in s.offsets().items()}
    s.produce(new=600, repeats=600)
    jobs = [s.start(2, i) for i in range(2)]
    lowest = dict(left)
    try:
        deadline = time.monotonic() + 300
        while lag_of(offsets := s.offsets()) > 0:  # one read of the group a round: its lag and its lowest offsets
            assert all(job.alive() for job in jobs) and time.monotonic() < deadline, jobs[0].log_tail(40)
            for p, (committed, _) in offsets.items():
                lowest[p] = min(lowest[p], committed)
            time.sleep(0.1)
    finally:
        stop_all(jobs)
    s.assert_exact()
    starts = [line.split(" resume ", 1)[1].split(", read from ") for f in tmp_path.glob("r*of2.log")
              for line in f.read_text().splitlines() if "new checkpoint" in line]
    assert len(starts) == 2 and all(resume != read_from for resume, read_from in starts), starts  # both warmed up
    assert lowest == left, f"the group moved back: {lowest} against {left} where the first layout stopped"


def test_returning_to_an_earlier_layout_writes_nothing_twice(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """Issue #14: one replica killed during its first batch, three replicas to the end, then one replica
    again on the same checkpoint root. Its old checkpoint planned exactly what the three layouts then
    wrote; resuming it replayed the whole batch (100,000 rows for 50,000 keys in the measured case)."""
    s = Stream(tmp_path, kafka, clickhouse)
    s.produce(new=6_000, repeats=1_000)
    doc = yaml.safe_load(s.path.read_text())
    doc["spec"]["sources"][0]["kafka"]["maxOffsetsPerTrigger"] = 100_000  # batch 0 plans every record
    s.path.write_text(yaml.safe_dump(doc, sort_keys=False))
    job = s.start(1, 0)
    layout = s.checkpoint / "replica-0-of-1"
    deadline = time.monotonic() + 240
    while not (layout / "offsets" / "0").exists():
        assert job.alive() and time.monotonic() < deadline, job.log_tail(60)
        time.sleep(0.05)
    assert not (layout / "commits" / "0").exists(), "batch 0 finished before it could be interrupted"
    job.kill()  # SIGKILL while batch 0 (planned to the end of every partition) is in flight
    jobs = [s.start(3, i) for i in range(3)]
    try:
        s.wait_drained(jobs)
    finally:
        stop_all(jobs)
    s.assert_exact()
    job = s.start(1, 0)  # back to the first layout, on the same checkpoint root
    s.produce(new=100, repeats=100)  # something new, so that draining means it has processed a batch
    try:
        s.wait_drained([job])
    finally:
        stop_all([job])
    s.assert_exact()
    assert "set aside" in (tmp_path / "r0of1.log").read_text()


def test_a_paused_old_replica_that_wakes_after_a_rescale_stops_by_itself(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """Issue #14, fencing: the old layout's driver keeps running after its SparkApplication was deleted.
    One replica is SIGSTOPped (JVM and Python) in the middle of a batch; two replicas of the new layout start
    on the same checkpoint root, roll its batch back and write; then the old one is SIGCONTed. ClickHouse
    must end exact and the old replica must stop by itself, saying which writer superseded it."""
    s = Stream(tmp_path, kafka, clickhouse)
    s.produce(new=2_000, repeats=500)
    old = s.start(1, 0)
    jobs: list[ServerProcess] = []
    pgid = 0
    try:
        s.wait_drained([old], timeout=900)
        layout = s.checkpoint / "replica-0-of-1"
        planned_before = max((int(p.name) for p in (layout / "offsets").iterdir() if p.name.isdigit()), default=-1)
        s.produce(new=6_000, repeats=1_500, malformed=60)  # several batches of 3,000 records, dead letters in each
        deadline = time.monotonic() + 600
        while True:  # pause it once a batch is planned (offset log) but not committed
            assert old.alive() and time.monotonic() < deadline, old.log_tail(60)
            planned = max((int(p.name) for p in (layout / "offsets").iterdir() if p.name.isdigit()), default=-1)
            if planned > planned_before and not (layout / "commits" / str(planned)).exists():
                break
            time.sleep(0.01)
        assert old.proc is not None
        pgid = os.getpgid(old.proc.pid)
        time.sleep(random.Random(5).uniform(0.0, 1.5))  # somewhere in the batch: compute, chunks or ledger
        os.killpg(pgid, signal.SIGSTOP)
        paused_in = planned
        jobs = [s.start(2, i) for i in range(2)]
        s.produce(new=500, repeats=500)
        s.wait_drained(jobs, timeout=900)
        s.assert_exact()  # the new layout alone: exact while the old one sleeps
        # Every dead letter is there at least once (a batch the old replica had sent before its pause and the
        # new layout rolled back and did again is there twice: at least once); from now on, exactly once each.
        dead_before = s.dead_letters()
        assert dead_before >= s.malformed, (dead_before, s.malformed)
        os.killpg(pgid, signal.SIGCONT)
        pgid = 0
        woke = time.monotonic()
        s.produce(new=500, repeats=500, malformed=20)  # new records on every partition: the old one plans a batch
        while old.alive() and time.monotonic() - woke < 300:
            time.sleep(0.5)
        stopped_after = time.monotonic() - woke
        log = (tmp_path / "r0of1.log").read_text()
        assert not old.alive(), f"the stale replica still runs {stopped_after:.0f} s after it woke:\n{log[-4000:]}"
        superseded = [line for line in log.splitlines() if "superseded by writer" in line]
        assert superseded, log[-4000:]
        s.produce(new=200, repeats=200)
        s.wait_drained(jobs, timeout=600)
    finally:
        if pgid:
            os.killpg(pgid, signal.SIGCONT)
        stop_all([old, *jobs])
    dead_after = s.dead_letters()
    print(f"paused in batch {paused_in}; stale replica stopped {stopped_after:.1f} s after SIGCONT: "
          f"{superseded[0][-300:]}; dead letters {dead_before} before SIGCONT, {dead_after} at the end "
          f"({s.malformed} malformed records)")
    s.assert_exact()
    # the stale replica sent none of its batch's dead letters again after it woke: only the 20 new ones came
    assert dead_after == dead_before + 20, (dead_before, dead_after)


def new_checkpoints(s: Stream, i: int, replicas: int) -> int:
    """How many new checkpoints replica ``i`` of ``replicas`` has logged so far (its log is appended to)."""
    log = s.tmp / f"r{i}of{replicas}.log"
    return log.read_text().count("new checkpoint") if log.exists() else 0


def kill_in_first_batch(s: Stream, jobs: list[ServerProcess], i: int, replicas: int, before: int) -> None:
    """SIGKILL replica ``i`` of ``replicas`` while the first batch of its new checkpoint (the warm-up: it re-reads
    the dedup window before its resume offsets) is planned but not committed, then start it again.
    ``before``: new_checkpoints() before it started (an earlier checkpoint of the layout is set aside first)."""
    layout = s.checkpoint / f"replica-{i}-of-{replicas}"
    deadline = time.monotonic() + 300
    while new_checkpoints(s, i, replicas) == before or not (layout / "offsets" / "0").exists():
        assert jobs[i].alive() and time.monotonic() < deadline, jobs[i].log_tail(60)
        time.sleep(0.01)
    assert not (layout / "commits" / "0").exists(), "the warm-up batch finished before it could be interrupted"
    jobs[i].kill()
    last = [line for line in (s.tmp / f"r{i}of{replicas}.log").read_text().splitlines() if "new checkpoint" in line]
    resume, read_from = last[-1].split(" resume ", 1)[1].split(", read from ")
    assert resume != read_from, last[-1]  # a hand-over with a warm-up: it reads from before where it resumes
    jobs[i] = s.start(replicas, i)


def test_layouts_1_3_1_with_a_new_replica_killed_during_its_warm_up(
    tmp_path: Path, kafka: KafkaServer, clickhouse: ClickHouseServer
) -> None:
    """Issue #14, layout matrix: a replica of the *new* layout SIGKILLed during its warm-up batch, going up
    (1 -> 3) and back down to a layout that ran before (3 -> 1), then restarted: exact rows at the end."""
    s = Stream(tmp_path, kafka, clickhouse)
    s.produce(new=3_000, repeats=1_000)
    jobs = [s.start(1, 0)]
    try:
        s.wait_drained(jobs, timeout=600)
        stop_all(jobs)
        s.produce(new=1_500, repeats=1_500)  # repeats of keys replica 0 of 1 wrote: the warm-up must know them
        jobs = [s.start(3, i) for i in range(3)]
        kill_in_first_batch(s, jobs, 1, 3, before=0)
        s.wait_drained(jobs, timeout=600)
        s.assert_exact()
        stop_all(jobs)
        s.produce(new=1_000, repeats=1_500)
        before = new_checkpoints(s, 0, 1)
        jobs = [s.start(1, 0)]  # back to 1: its old checkpoint is behind the ledger and is set aside
        kill_in_first_batch(s, jobs, 0, 1, before)
        s.wait_drained(jobs, timeout=600)
    finally:
        stop_all(jobs)
    s.assert_exact()
    assert "set aside" in (tmp_path / "r0of1.log").read_text()
