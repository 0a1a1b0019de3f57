"""Waiting for the DELETE mutations the sink issues (stale chunks, roll-backs), with a deadline.

ClickHouse applies the mutations of a table in order: one that cannot finish (its expression throws on
some part, a part is locked, the disk is full) holds back every later one, ours included, for ever.
While a delete is pending each poll says how far it is (``MutationPending``, retried and logged by the
connection's retry loop); past the deadline (``sink.clickhouse.mutationTimeout``, the connection's
``mutation_deadline``) the replica stops with ``MutationStuck``, naming the unfinished mutations of the
table, what to do about them and the field to raise. The message becomes the driver's termination
message (one line, at most 4 KiB), so the parts a reader needs come first and the list is capped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from glasspipe_job.clickhouse.errors import MutationPending, SinkError

log = logging.getLogger(__name__)

# seconds: a delete of a few chunks takes seconds, rewriting big parts minutes. The job passes the spec's
# sink.clickhouse.mutationTimeout (whose CRD default, 15m, is this; a unit test keeps them equal).
DEFAULT_MUTATION_DEADLINE = 900.0
TIMEOUT_FIELD = "spec.sink.clickhouse.mutationTimeout"
MAX_DESCRIBED = 5  # mutations named in a message; the rest are counted
MAX_COMMAND = 200  # characters of a mutation's command in a message


class MutationStuck(SinkError):
    """A delete the sink issued did not finish before the deadline: the message says which mutations block it."""


class Mutation(NamedTuple):
    mutation_id: str
    command: str
    parts_to_do: int


def unfinished(client: Any, database: str, table: str) -> list[Mutation]:
    """The table's mutations that are not done yet, oldest first (system.mutations, every version)."""
    rows = client.execute(
        "SELECT mutation_id, command, parts_to_do FROM system.mutations WHERE database = %(db)s AND "
        "table = %(t)s AND is_done = 0 ORDER BY create_time, mutation_id",
        {"db": database, "t": table},
    )
    return [Mutation(str(i), str(c), int(p)) for i, c, p in rows]


def describe(mutations: Sequence[Mutation]) -> str:
    """The first MAX_DESCRIBED mutations (commands cut at MAX_COMMAND characters), then how many more."""
    def one(m: Mutation) -> str:
        command = m.command if len(m.command) <= MAX_COMMAND else m.command[:MAX_COMMAND] + "..."
        return f"{m.mutation_id} ({command!r}, {m.parts_to_do} part(s) to do)"

    text = "; ".join(one(m) for m in mutations[:MAX_DESCRIBED]) or "none"
    if len(mutations) > MAX_DESCRIBED:
        text += f"; and {len(mutations) - MAX_DESCRIBED} more"
    return text


def overdue(started: float, now: float, deadline: float | None) -> bool:
    return deadline is not None and now - started > deadline


def stuck_message(what: str, full_table: str, database: str, table: str, waited: float,
                  mutations: Sequence[Mutation], deadline: float | None = None) -> str:
    first = mutations[0].mutation_id if mutations else "<mutation_id>"
    limit = f" ({TIMEOUT_FIELD} is {deadline:g} s)" if deadline is not None else ""
    return (
        f"{what}: the DELETE on {full_table} has not finished after {waited:.0f} s{limit}; unfinished mutations "
        f"of the table, oldest first (ClickHouse runs them in this order): {describe(mutations)}. "
        f"Fix: find why the oldest cannot finish (system.mutations, the server log); if it never will, "
        f"remove it (ClickHouse 19.x+: KILL MUTATION WHERE database = '{database}' AND table = '{table}' AND "
        f"mutation_id = '{first}'; older servers: delete its {first} file in the table's data folder and "
        f"restart the server), then restart this replica (spark-operator restarts a failed one by itself): it "
        f"issues its delete again. If the mutations are "
        f"only slow (big parts to rewrite), raise {TIMEOUT_FIELD}. Rows of the delete are visible to readers "
        f"until it finishes"
    )


class MutationWatch:
    """One delete the sink waits for: ``issued()`` when the ALTER was sent, then ``pending()`` on every poll
    that still finds rows, which returns the exception to raise (retry, or give up past the deadline).
    ``on_stuck`` hears of a MutationStuck before it is raised: raised inside Spark's foreachBatch it reaches
    the driver wrapped in a StreamingQueryException, and the job reports this one's words instead."""

    def __init__(self, client_of: Any, database: str, table: str, full_table: str, what: str,
                 deadline: float | None, clock: Any,
                 on_stuck: Callable[[MutationStuck], None] | None = None) -> None:
        self._client_of = client_of  # () -> client: the connection may be rebuilt between polls
        self.database, self.table, self.full_table, self.what = database, table, full_table, what
        self.deadline, self.clock, self.on_stuck = deadline, clock, on_stuck
        self.started: float | None = None

    def issued(self) -> None:
        if self.started is None:
            self.started = self.clock()

    def running(self) -> list[Mutation]:
        return unfinished(self._client_of(), self.database, self.table)

    def pending(self, mutations: Sequence[Mutation] | None = None) -> Exception:
        self.issued()
        assert self.started is not None
        waited = self.clock() - self.started
        if mutations is None:
            mutations = self.running()
        if overdue(self.started, self.clock(), self.deadline):
            stuck = MutationStuck(stuck_message(self.what, self.full_table, self.database, self.table, waited,
                                                mutations, self.deadline))
            if self.on_stuck is not None:
                self.on_stuck(stuck)
            return stuck
        return MutationPending(f"{self.what}: waiting {waited:.0f} s for the DELETE on {self.full_table} "
                               f"(unfinished mutations: {describe(mutations)})")
