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


def test_a_batchs_late_dead_letters_are_noted_by_partition_for_its_ledger_row() -> None:
    """Of a batch's dead rows, only those dead-lettered as late count, per (topic, partition) over all of its parts:
    lowest and highest offset, latest event time in ms (floored, as the operators read event times)."""
    from datetime import UTC, datetime

    from glasspipe_job.batch_writer import _BatchCounts
    from glasspipe_job.clickhouse.ledger import LateRange
    from glasspipe_job.transform import EVENT_TIME, REASON

    def dead(rows: list[tuple[int, int, str, datetime | None]]) -> pa.Table:
        return pa.table({"_gp_topic": ["t"] * len(rows), "_gp_partition": [r[0] for r in rows],
                         "_gp_offset": [r[1] for r in rows], REASON: [r[2] for r in rows],
                         EVENT_TIME: pa.array([r[3] for r in rows], pa.timestamp("us", "UTC"))})

    at = datetime(2026, 11, 1, 8, 0, 0, 1999, tzinfo=UTC)  # 1.999 ms past the second
    ms = int(datetime(2026, 11, 1, 8, tzinfo=UTC).timestamp() * 1000) + 1
    seen = _BatchCounts()
    seen.add_late(dead([(0, 7, "late: event time ...", at), (0, 3, "malformed_json: x", None),
                        (1, 40, "late: event time ...", datetime(2026, 11, 1, 7, tzinfo=UTC)),
                        (0, 12, "schema_mismatch: y", at.replace(hour=9))]))
    seen.add_late(dead([(0, 5, "late: event time ...", at.replace(minute=0, microsecond=0))]))
    assert seen.late == {("t", 0): (5, 7, ms), ("t", 1): (40, 40, ms - 3_600_001)}
    assert seen.late_ranges() == [LateRange("t", 0, 5, 7, ms), LateRange("t", 1, 40, 40, ms - 3_600_001)]
    assert _BatchCounts().late_ranges() == []
