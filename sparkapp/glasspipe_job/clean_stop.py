"""A stop (SIGTERM, Ctrl-C, a restart) that ends the query between micro-batches, never inside one.

``StreamingQuery.stop()`` interrupts the batch in flight: it fails in the middle of its writes (exact all the same,
by the sink's ledger, but replayed on the next start, and noisy). Waiting for ``isTriggerActive`` to be false
first left a race: the next trigger could start between that look and the stop, and on a busy machine batches
run back to back, so the look rarely saw a gap at all. The query is ended instead by marking it terminated
(the ops jar's QueryEnd): the batch in flight runs to its end and commits, and the trigger loop ends after it.

Spark checks that mark once more just before a batch's plan runs and interrupts the batch if it is set by then,
so the mark is set where no batch can be between those two checks: from inside the writer's call (at once if a
batch is in it, else when the next batch enters it), or while the query's thread sleeps until its next trigger
(woken then, so that an idle stream stops at once rather than at its next trigger time).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol


class QueryEnding(Protocol):
    """The ways to end one started query (jvm.QueryEnd)."""

    def after_batch_in_flight(self) -> bool:
        """Mark the query to end after its batch in flight; False if it cannot be."""

    def if_waiting_for_trigger(self) -> bool:
        """Mark and wake the query if its thread sleeps until its next trigger; False (nothing done) otherwise."""

    def thread_ended(self, seconds: float) -> bool:
        """Whether the query's thread has ended, waiting up to ``seconds``."""


class StopBetweenBatches:
    """Where the writer's batches stand for a stop: shared by the writer's call (Spark's stream thread) and the
    runner (the job's main thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ending: QueryEnding | None = None
        self._asked = False
        self._in_batch = False
        self._marked = threading.Event()  # the query is marked to end (its thread may still run its last batch)

    @property
    def ended(self) -> bool:
        """The query is marked to end (its thread may still run its last batch)."""
        return self._marked.is_set()

    def bind(self, ending: QueryEnding) -> None:
        with self._lock:
            self._ending = ending

    def batch_started(self) -> None:
        """The writer's call began (Spark's last check before the batch is behind it): a stop asked for ends the
        query after this batch."""
        with self._lock:
            self._in_batch = True
            if self._asked:
                self._mark()

    def batch_ended(self) -> None:
        with self._lock:
            self._in_batch = False

    def ask(self) -> None:
        """Ends the query after the batch in the writer's call, or else after the next batch to enter it."""
        with self._lock:
            self._asked = True
            if self._in_batch:
                self._mark()

    def wait_marked(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the query to be marked; whether it is."""
        return self._marked.wait(seconds)

    def end_if_waiting_for_trigger(self) -> bool:
        """Mark the query now if its thread sleeps until its next trigger (no batch runs, none will); whether the
        query is marked."""
        with self._lock:
            if not self._in_batch:
                self._mark(lambda ending: ending.if_waiting_for_trigger())
            return self.ended

    def thread_ended(self, seconds: float) -> bool:
        """Whether the query's thread has ended, waiting up to ``seconds``: once the query is marked, Spark's
        awaitTermination answers True from the mark alone, while the last batch may still run."""
        return self._ending is not None and self._ending.thread_ended(seconds)

    def _mark(self, how: Callable[[QueryEnding], bool] = lambda ending: ending.after_batch_in_flight()) -> None:
        """Mark the query ``how`` says (after its batch in flight by default), once; under the lock."""
        if not self.ended and self._ending is not None and how(self._ending):
            self._marked.set()
