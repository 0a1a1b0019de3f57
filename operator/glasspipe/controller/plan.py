"""Child diffing: which SparkApplications to delete and create to converge on the render. Pure.

spark-operator restarts a driver on any spec change, and a rescale changes every replica's config
(which partitions it owns), so the operator never edits a running application: an application whose
``glasspipe.io/spec-hash`` differs from the render is *stale* and is deleted, and new applications are
created only once no stale driver can still be processing (stop-first; see docs/scaling.md).
Applications that match the render are left alone, byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from glasspipe.conditions import TERMINAL_STATES
from glasspipe.render import REPLICA_LABEL, SPEC_HASH_ANNOTATION


def spec_hash_of(obj: dict[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION)


def app_state(obj: dict[str, Any]) -> str:
    return str(((obj.get("status") or {}).get("applicationState") or {}).get("state") or "")


def replica_index(obj: dict[str, Any]) -> int:
    """The replica number: from its label, else the ``-<i>`` name suffix, else -1."""
    meta = obj.get("metadata") or {}
    raw = (meta.get("labels") or {}).get(REPLICA_LABEL) or str(meta.get("name", "")).rpartition("-")[2]
    try:
        return int(raw)
    except ValueError:
        return -1


@dataclass
class Plan:
    """What to do now; ``waiting`` are desired applications held back by the stop-first barrier."""

    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    current: list[str] = field(default_factory=list)

    @property
    def converged(self) -> bool:
        return not (self.create or self.delete or self.stale or self.waiting)


def plan_children(desired: Sequence[dict[str, Any]], actual: Sequence[dict[str, Any]]) -> Plan:
    """Diff the rendered applications against the pipeline's existing ones (matched by name)."""
    want = {d["metadata"]["name"]: d for d in desired}
    have = {a["metadata"]["name"]: a for a in actual}
    plan = Plan()
    blocking = False
    for name in sorted(have):
        obj = have[name]
        wanted = want.get(name)
        deleting = bool(obj["metadata"].get("deletionTimestamp"))
        if wanted is not None and not deleting and spec_hash_of(obj) == spec_hash_of(wanted):
            plan.current.append(name)
            continue
        plan.stale.append(name)
        if not deleting:
            plan.delete.append(name)
        # A stale application still present blocks creation unless its driver has stopped.
        if app_state(obj) not in TERMINAL_STATES:
            blocking = True
    missing = [n for n in want if n not in have]
    replacing = [n for n in want if n in have and n in plan.stale]  # created once the old one is gone
    if blocking:
        plan.waiting = missing + replacing
    else:
        plan.create = [want[n] for n in missing]
        plan.waiting = replacing
    return plan
