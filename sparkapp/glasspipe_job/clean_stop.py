"""A stop (SIGTERM, Ctrl-C) that ends the query between micro-batches, never inside one.

``StreamingQuery.stop()`` interrupts the batch in flight: it fails in the middle of its writes (exact all the same,
by the sink's ledger, but replayed on the next start, and noisy). Waiting for ``isTriggerActive`` to be false
first left a race: the next trigger could start between that look and the stop, and on a busy machine batches
run back to back, so the look rarely saw a gap at all. The query is ended instead by marking it terminated
(jvm.end_query_after_batch): the batch in flight runs to its end and commits, and the trigger loop ends after it.
Spark checks that mark once more just before a batch's plan runs and interrupts the batch if it is set by then, so
the mark is set from inside the writer's call, past that check: at once if a batch is in it, else when the next
batch enters it. A stream with no new data starts no batch: the runner then sets the mark between batches itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class StopBetweenBatches:
    """Where the writer's batches stand for a stop: shared by the writer's call (Spark's stream thread) and the
    runner (the job's main thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._end: Callable[[], bool] | None = None
        self._thread_ended: Callable[[float], bool] | None = None
        self._asked = False
        self._in_batch = False
        self.ended = False  # the query is marked to end after its batch in flight (its thread may still run)

    def bind(self, end: Callable[[], bool], thread_ended: Callable[[float], bool]) -> None:
        """``end`` marks the started query to end after its batch in flight (False if it cannot);
        ``thread_ended(seconds)`` then waits that long for the query's thread to end, and says whether it has."""
        with self._lock:
            self._end, self._thread_ended = end, thread_ended

    def ended_within(self, seconds: float) -> bool | None:
        """Once the query is marked, whether its thread has ended within ``seconds`` (the mark alone makes Spark's
        awaitTermination answer True); None before, when Spark's own answer holds."""
        if not self.ended or self._thread_ended is None:
            return None
        return self._thread_ended(seconds)

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

    def end_when_idle(self) -> None:
        """No batch entered the writer's call since the stop was asked for: mark the query now. A trigger that is
        just planning a batch then has it interrupted at its start, before any write of it."""
        with self._lock:
            self._mark()

    def _mark(self) -> None:
        if not self.ended and self._end is not None:
            self.ended = self._end()
