"""The pipeline's Kafka consumer group: where a new checkpoint starts, and committed progress.

Spark's Kafka source neither reads nor commits group offsets; glasspipe commits the offsets of each
micro-batch after its rows are committed in ClickHouse, so ``kafka-consumer-groups --describe`` shows
the pipeline's real lag, and a replica that takes over partitions starts where the group left off.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

EARLIEST = -2
LATEST = -1
T = TypeVar("T")
# The group coordinator moves or is still loading right after a broker starts: ask again.
_RETRIABLE = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
              KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
              KafkaError.REBALANCE_IN_PROGRESS}


def _with_retries(what: str, fn: Callable[[], T], deadline_s: float = 60.0) -> T:
    deadline = time.monotonic() + deadline_s
    delay = 0.2
    while True:
        try:
            return fn()
        except KafkaException as e:
            err = e.args[0] if e.args else None
            code = err.code() if isinstance(err, KafkaError) else None
            if code not in _RETRIABLE or time.monotonic() > deadline:
                raise RuntimeError(f"{what} failed: {e}") from e
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def fallback_offset(starting_offsets: str) -> int:
    """Where a partition without a committed offset starts (``kafka.startingOffsets``), as Spark reads it."""
    return EARLIEST if starting_offsets == "earliest" else LATEST


def owned_partitions(partitions: Iterable[int], replica: int, replicas: int) -> list[int]:
    """Replica i of N owns partitions p with p mod N == i: deterministic, disjoint, covering."""
    return sorted(p for p in partitions if p % replicas == replica)


def not_behind(offsets: Mapping[str, Mapping[Any, int]], floor: Mapping[str, Mapping[int, int]]
               ) -> dict[str, dict[int, int]]:
    """A batch's end offsets, each raised to ``floor``'s for its partition. A new writer's first batches re-read
    records its predecessors wrote (the warm-up) and end before where it resumes; committing those would move the
    group back by up to a window and show that as lag to every tool that reads it (and to autoscalers)."""
    return {t: {int(p): max(int(o), floor.get(t, {}).get(int(p), int(o))) for p, o in parts.items()}
            for t, parts in offsets.items()}


class ConsumerGroup:
    """Reads and commits one consumer group's offsets without joining the group."""

    def __init__(self, client_conf: dict[str, str], group: str) -> None:
        self.group = group
        self._conf = {**client_conf, "group.id": group, "enable.auto.commit": "false"}
        self._consumer: Consumer | None = None

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self._conf)
        return self._consumer

    def partitions(self, topic: str, timeout: float = 30.0) -> list[int]:
        admin = AdminClient({k: v for k, v in self._conf.items() if k not in ("group.id", "enable.auto.commit")})
        meta = admin.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            raise RuntimeError(f"Kafka topic {topic!r} is not available: {meta.error if meta else 'not found'}; "
                               "create it or fix spec.sources[].kafka.topic")
        return sorted(meta.partitions)

    def committed(self, topic: str, partitions: list[int], timeout: float = 30.0) -> dict[int, int]:
        """Committed offset per partition; partitions without one are left out."""
        tps = _with_retries(f"reading offsets of group {self.group}", lambda: self.consumer.committed(
            [TopicPartition(topic, p) for p in partitions], timeout=timeout))
        return {tp.partition: tp.offset for tp in tps if tp.offset != OFFSET_INVALID and tp.offset >= 0}

    def end_offsets(self, topic: str, partitions: Iterable[int], timeout: float = 30.0) -> dict[int, int]:
        """Per partition, the offset the next record appended will get: where Spark's ``latest`` starts."""

        def end(p: int) -> int:
            _low, high = self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            return int(high)

        return {p: _with_retries(f"reading the end offset of {topic}[{p}]", functools.partial(end, p))
                for p in partitions}

    def commit(self, offsets: dict[str, dict[int, int]]) -> None:
        """Commit next-offsets-to-read (Spark's end offsets) synchronously."""
        tps = [TopicPartition(t, int(p), int(o)) for t, parts in offsets.items() for p, o in parts.items()]
        if not tps:
            return
        _with_retries(f"committing offsets of group {self.group}",
                      lambda: self.consumer.commit(offsets=tps, asynchronous=False))

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
