"""A DELETE past sink.clickhouse.mutationTimeout, as the user sees it: the job's termination message names
the stuck mutations, the table and the field to raise, and the operator puts it in the Degraded condition.

The sink raises MutationStuck inside Spark's foreachBatch; Spark hands the driver a StreamingQueryException
whose first line is its own ("[STREAM_FAILED] ..."), so the job reports the error the table kept instead."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from glasspipe import conditions as cond
from glasspipe import contract
from glasspipe.api.validation import OutputColumn
from glasspipe_job import failure
from glasspipe_job.clickhouse.connection import Connection
from glasspipe_job.clickhouse.ledger import Superseded
from glasspipe_job.clickhouse.mutations import Mutation, MutationStuck
from glasspipe_job.clickhouse.table import ClickHouseTable
from glasspipe_job.replica_loop import _await
from glasspipe_job.runner import RunningPipeline

pytestmark = pytest.mark.unit

SPARK_TEXT = ("[STREAM_FAILED] Query glasspipe-orders-0 terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] "
              "An error occurred in the user provided function in foreach batch sink.\nTraceback ...")


class StreamingQueryException(Exception):
    """Stands for pyspark's: its message is Spark's, not ours."""


class FailedQuery:
    def awaitTermination(self, timeout: int | None = None) -> bool:
        raise StreamingQueryException(SPARK_TEXT)


def stuck_table(deadline: float) -> ClickHouseTable:
    """A table whose DELETE passed ``deadline`` behind a mutation that throws on every part."""
    now = [0.0]
    conn = Connection(["ch:9000"], "shop", mutation_deadline=deadline, client_factory=lambda: None,  # type: ignore[arg-type,return-value]
                      clock=lambda: now[0])
    table = ClickHouseTable(conn, "orders", [OutputColumn("id", "`id`", "Int64", "s.id")])
    watch = table.mutation_watch("rolling back batch shop.orders.0of1-1a2b/17/")
    watch.issued()
    now[0] = deadline + 1
    watch.pending([Mutation("mutation_2.txt", "DELETE WHERE throwIf(id >= 0) = 1", 1)])
    return table


def running(table: ClickHouseTable, superseded: str | None = None, found_later: str | None = None) -> RunningPipeline:
    """``found_later``: what the sink's fence check, read once the query failed, says (None: not superseded)."""
    sink: Any = SimpleNamespace(table=table, superseded=superseded, close=lambda: None,
                                superseded_after_failure=lambda: superseded or found_later)
    return RunningPipeline(FailedQuery(), None, sink, [])  # type: ignore[arg-type]


def test_a_stuck_delete_in_foreach_batch_becomes_the_termination_message_and_degraded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(MutationStuck) as raised:
        _await(running(stuck_table(900.0)))
    assert isinstance(raised.value.__cause__, StreamingQueryException)
    log = tmp_path / "termination-log"
    monkeypatch.setenv(contract.ENV_TERMINATION_LOG, str(log))
    failure.report_exception(raised.value, [])  # what main() does with whatever stopped the replica
    line = log.read_text()
    assert line.startswith("rolling back batch shop.orders.0of1-1a2b/17/: the DELETE on `shop`.`orders` has not "
                           "finished after 901 s (spec.sink.clickhouse.mutationTimeout is 900 s)")
    assert "mutation_2.txt ('DELETE WHERE throwIf(id >= 0) = 1', 1 part(s) to do)" in line
    assert "raise spec.sink.clickhouse.mutationTimeout" in line and "\n" not in line

    pod = {"metadata": {"ownerReferences": [{"kind": "SparkApplication", "uid": "u1"}]},
           "status": {"containerStatuses": [{"name": "spark-kubernetes-driver", "state": {
               "terminated": {"exitCode": 1, "reason": "Error", "message": line}}}]}}
    app = {"metadata": {"name": "orders-0", "uid": "u1"},
           "status": {"applicationState": {"state": "FAILED",
                                           "errorMessage": "driver container failed with ExitCode: 1, Reason: Error"}}}
    a = cond.assess(1, [cond.observe_app(app, 0, True, cond.termination_messages([pod]))])
    degraded = next(c for c in a.conditions if c.type == cond.DEGRADED)
    assert degraded.status == "True"
    assert degraded.message.startswith(f"replica orders-0 is FAILED: {line}")
    assert a.replica_statuses[0]["message"].startswith(line)
    assert "KILL MUTATION WHERE database = 'shop' AND table = 'orders' AND mutation_id = 'mutation_2.txt'" in (
        degraded.message)


def test_other_query_failures_keep_spark_s_words_and_a_stepped_down_writer_says_both() -> None:
    healthy = ClickHouseTable(Connection(["ch:9000"], "shop"), "orders", [OutputColumn("id", "`id`", "Int64", None)])
    with pytest.raises(StreamingQueryException):
        _await(running(healthy))
    with pytest.raises(Superseded) as raised:
        _await(running(stuck_table(60.0), superseded="writer w0 was superseded by w1"))
    assert str(raised.value).startswith("writer w0 was superseded by w1; then rolling back batch")
    assert "spec.sink.clickhouse.mutationTimeout is 60 s" in str(raised.value)


def test_a_micro_batch_error_is_reported_in_its_own_words() -> None:
    """Any other error raised in foreachBatch (here a dead-letter send) replaces Spark's wrapper as well."""
    healthy = ClickHouseTable(Connection(["ch:9000"], "shop"), "orders", [OutputColumn("id", "`id`", "Int64", None)])
    pipeline = running(healthy)
    pipeline.writer = SimpleNamespace(failure=ConnectionError("dead-letter topic orders-dlq: broker down"))  # type: ignore[assignment]
    with pytest.raises(ConnectionError) as raised:
        _await(pipeline)
    assert isinstance(raised.value.__cause__, StreamingQueryException)
    assert failure.explain(raised.value) == "ConnectionError: dead-letter topic orders-dlq: broker down"



def test_a_stale_writer_whose_query_fails_on_kafka_says_it_was_superseded_and_what_failed() -> None:
    """A replica paused past a rescale wakes in the middle of its batch: its Kafka read may time out before
    the sink checks the fence. Its newer layout is why it stops, so the termination message says so first."""
    healthy = ClickHouseTable(Connection(["ch:9000"], "shop"), "orders", [OutputColumn("id", "`id`", "Int64", None)])

    class KafkaTimeout(FailedQuery):
        def awaitTermination(self, timeout: int | None = None) -> bool:
            raise StreamingQueryException("[STREAM_FAILED] Query glasspipe-orders-0 terminated with exception: "
                                          "Timeout of 60000ms expired before the position for partition orders-5 "
                                          "could be determined\n\tat org.apache.kafka...")

    pipeline = running(healthy, found_later="writer w0 (generation 1) is superseded by writer w1 (generation 2)")
    pipeline.query = KafkaTimeout()  # type: ignore[assignment]
    with pytest.raises(Superseded) as raised:
        _await(pipeline)
    assert isinstance(raised.value.__cause__, StreamingQueryException)
    message = failure.explain(raised.value)
    assert message.startswith("writer w0 (generation 1) is superseded by writer w1 (generation 2); its query had "
                              "stopped on StreamingQueryException: [STREAM_FAILED]"), message
    assert "position for partition orders-5 could be determined" in message and "\n" not in message
