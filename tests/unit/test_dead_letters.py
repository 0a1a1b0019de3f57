"""DeadLetters.send: what a dead-letter record carries (no Kafka: a recording producer)."""

from __future__ import annotations

from typing import Any, cast

import pyarrow as pa
from confluent_kafka import Producer

from glasspipe_job.batch_writer import DeadLetters


class RecordingProducer:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def produce(self, topic: str, **kw: Any) -> None:
        self.sent.append({"topic": topic, **kw})
        kw["on_delivery"](None, None)

    def poll(self, _timeout: float) -> None:
        pass

    def flush(self, _timeout: float) -> int:
        return 0


def test_a_dead_letter_keeps_the_original_key_and_value() -> None:
    """Issue #14: the dead-letter record lost the source record's Kafka key."""
    dl = DeadLetters.__new__(DeadLetters)
    producer = RecordingProducer()
    dl.topic, dl.pipeline, dl.producer = "dlq", "ns/p", cast(Producer, producer)
    rows = pa.table({"_gp_topic": ["t", "t"], "_gp_partition": [3, 4], "_gp_offset": [17, 18],
                     "_gp_value": [b"{bad", b"x"], "_gp_key": [b"k-1", None],
                     "_gp_reason": ["malformed_json: not a JSON object", "late: ..."]})
    assert dl.send(rows) == 2
    first, second = producer.sent
    assert (first["key"], first["value"], second["key"]) == (b"k-1", b"{bad", None)
    assert dict(first["headers"])["glasspipe.source.offset"] == b"17"
    assert dict(first["headers"])["glasspipe.reason"] == b"malformed_json: not a JSON object"
