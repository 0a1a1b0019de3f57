"""When a stop marks the query to end (clean_stop.StopBetweenBatches): only from inside the writer's call, past
Spark's last check before a batch runs, or while the query's thread sleeps until its next trigger; and once."""

from __future__ import annotations

from glasspipe_job.clean_stop import StopBetweenBatches


class FakeEnding:
    """Records what the stop asked of the query (the real one is jvm.QueryEnd)."""

    def __init__(self, markable: bool = True, asleep: bool = False) -> None:
        self.markable = markable
        self.asleep = asleep
        self.calls: list[str] = []

    def after_batch_in_flight(self) -> bool:
        self.calls.append("marked after batch")
        return self.markable

    def if_waiting_for_trigger(self) -> bool:
        self.calls.append("asleep?")
        return self.markable and self.asleep

    def thread_ended(self, seconds: float) -> bool:
        self.calls.append(f"joined {seconds} s")
        return True


def _stop(**kwargs: bool) -> tuple[StopBetweenBatches, FakeEnding]:
    stop, ending = StopBetweenBatches(), FakeEnding(**kwargs)
    stop.bind(ending)
    return stop, ending


def test_a_stop_during_a_batch_marks_the_query_at_once() -> None:
    stop, ending = _stop()
    stop.batch_started()
    stop.ask()
    assert ending.calls == ["marked after batch"] and stop.ended and stop.wait_marked(0)
    stop.batch_ended()
    stop.batch_started()  # Spark starts no batch after the mark; were one to start, it is not marked twice
    assert ending.calls == ["marked after batch"]


def test_a_stop_between_batches_waits_for_the_next_batch_to_enter_the_writer() -> None:
    stop, ending = _stop()
    stop.batch_started()
    stop.batch_ended()  # Spark is committing the batch, or planning the next: a mark now would interrupt that one
    stop.ask()
    assert ending.calls == [] and not stop.ended and not stop.wait_marked(0.01)
    assert not stop.end_if_waiting_for_trigger()  # not asleep either
    stop.batch_started()
    assert ending.calls == ["asleep?", "marked after batch"] and stop.ended and stop.wait_marked(0)


def test_batches_before_the_stop_are_not_marked() -> None:
    stop, ending = _stop()
    for _ in range(3):
        stop.batch_started()
        stop.batch_ended()
    assert ending.calls == [] and not stop.ended


def test_a_query_asleep_until_its_next_trigger_is_marked_by_the_runner() -> None:
    stop, ending = _stop(asleep=True)
    stop.ask()
    assert stop.end_if_waiting_for_trigger() and stop.ended and stop.wait_marked(0)
    assert stop.end_if_waiting_for_trigger() and ending.calls == ["asleep?"]  # once
    assert stop.thread_ended(1) and ending.calls[-1] == "joined 1 s"


def test_the_thread_is_not_asked_about_while_a_batch_is_in_the_writer() -> None:
    """The batch itself marks the query; a look at the thread then is needless (it is in the batch)."""
    stop, ending = _stop(asleep=True, markable=False)
    stop.batch_started()
    assert not stop.end_if_waiting_for_trigger() and ending.calls == []


def test_a_query_that_cannot_be_marked_is_left_to_stop() -> None:
    """No ops jar, or not a micro-batch query: ``ended`` stays False and the runner calls StreamingQuery.stop()."""
    stop, ending = _stop(markable=False)
    stop.batch_started()
    stop.ask()
    assert ending.calls == ["marked after batch"] and not stop.ended and not stop.wait_marked(0.01)
    assert not StopBetweenBatches().thread_ended(1)  # unbound: nothing to wait for
