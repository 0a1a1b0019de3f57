"""When a stop marks the query to end (clean_stop.StopBetweenBatches): only from inside the writer's call, past
Spark's last check before a batch runs, or once the stream has been idle; and once."""

from __future__ import annotations

from glasspipe_job.clean_stop import StopBetweenBatches


def _stop(result: bool = True) -> tuple[StopBetweenBatches, list[str]]:
    marks: list[str] = []
    stop = StopBetweenBatches()

    def end() -> bool:
        marks.append("marked")
        return result

    def thread_ended(seconds: float) -> bool:
        marks.append(f"waited {seconds} s")
        return True

    stop.bind(end, thread_ended)
    return stop, marks


def test_a_stop_during_a_batch_marks_the_query_at_once() -> None:
    stop, marks = _stop()
    stop.batch_started()
    stop.ask()
    assert marks == ["marked"] and stop.ended
    stop.batch_ended()
    stop.batch_started()  # Spark starts no batch after the mark; were one to start, it is not marked twice
    assert marks == ["marked"]


def test_a_stop_between_batches_waits_for_the_next_batch_to_enter_the_writer() -> None:
    stop, marks = _stop()
    stop.batch_started()
    stop.batch_ended()  # Spark is committing the batch, or planning the next: a mark now would interrupt that one
    stop.ask()
    assert marks == [] and not stop.ended
    stop.batch_started()
    assert marks == ["marked"] and stop.ended


def test_batches_before_the_stop_are_not_marked() -> None:
    stop, marks = _stop()
    for _ in range(3):
        stop.batch_started()
        stop.batch_ended()
    assert marks == [] and not stop.ended


def test_an_idle_stream_is_marked_by_the_runner() -> None:
    stop, marks = _stop()
    stop.ask()
    stop.end_when_idle()
    assert marks == ["marked"] and stop.ended


def test_a_query_that_cannot_be_marked_is_left_to_stop() -> None:
    """No ops jar, or not a micro-batch query: ``ended`` stays False and the runner calls StreamingQuery.stop()."""
    stop, marks = _stop(result=False)
    stop.batch_started()
    stop.ask()
    assert marks == ["marked"] and not stop.ended


def test_the_end_is_waited_for_on_the_thread_once_the_query_is_marked() -> None:
    """Spark's awaitTermination says True as soon as the query is marked, while its last batch still runs."""
    stop, marks = _stop()
    assert stop.ended_within(1) is None  # not marked: Spark's own answer holds
    stop.ask()
    stop.end_when_idle()
    assert stop.ended_within(1) is True and marks == ["marked", "waited 1 s"]
