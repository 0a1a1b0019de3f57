"""Child diffing: which SparkApplications to delete, create or relabel to converge on the render. Pure.

spark-operator restarts a driver on any spec change, and a rescale changes every replica's config
(which partitions it owns), so the operator never edits a running application's spec: an application
whose spec no longer holds the render (a new spec-hash, or a hand edit: *drift*) is *stale* and is
deleted, and new applications are created only once no stale driver can still be processing
(stop-first; see docs/scaling.md). Lost labels or annotations are restored by a metadata patch, which
spark-operator ignores. Applications that hold the render are left alone, byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from glasspipe.controller.spark_operator import TERMINAL_STATES, app_state
from glasspipe.render import REPLICA_LABEL, SPEC_HASH_ANNOTATION


def spec_hash_of(obj: dict[str, Any]) -> str | None:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION)


def replica_index(obj: dict[str, Any]) -> int:
    """The replica number: from its label, else the ``-<i>`` name suffix, else -1."""
    meta = obj.get("metadata") or {}
    raw = (meta.get("labels") or {}).get(REPLICA_LABEL) or str(meta.get("name", "")).rpartition("-")[2]
    try:
        return int(raw)
    except ValueError:
        return -1


def holds(wanted: Any, actual: Any) -> bool:
    """Whether ``actual`` carries every value of ``wanted``: fields the API server or spark-operator
    add (defaults) are allowed, a changed or missing rendered field is not."""
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(k in actual and holds(v, actual[k]) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (isinstance(actual, list) and len(actual) == len(wanted)
                and all(holds(w, a) for w, a in zip(wanted, actual, strict=True)))
    return bool(wanted == actual)


def metadata_patch(wanted: dict[str, Any], actual: dict[str, Any]) -> dict[str, Any] | None:
    """A merge patch restoring the rendered labels and annotations, or None when they are all there."""
    patch: dict[str, Any] = {}
    for part in ("labels", "annotations"):
        want = wanted["metadata"].get(part) or {}
        have = actual["metadata"].get(part) or {}
        missing = {k: v for k, v in want.items() if have.get(k) != v}
        if missing:
            patch[part] = missing
    return {"metadata": patch} if patch else None


@dataclass
class Plan:
    """What to do now; ``waiting`` are desired applications held back by the stop-first barrier."""

    create: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    current: list[str] = field(default_factory=list)
    drifted: list[str] = field(default_factory=list)  # stale because its spec was edited, not re-rendered
    relabel: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> metadata merge patch
    lingering: list[str] = field(default_factory=list)  # old driver pods that hold back ``create``

    @property
    def converged(self) -> bool:
        return not (self.create or self.delete or self.stale or self.waiting or self.relabel)


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
        if wanted is not None and not deleting and holds(wanted["spec"], obj.get("spec")):
            plan.current.append(name)
            patch = metadata_patch(wanted, obj)
            if patch is not None:
                plan.relabel[name] = patch
            continue
        plan.stale.append(name)
        if wanted is not None and not deleting and spec_hash_of(obj) == spec_hash_of(wanted):
            plan.drifted.append(name)
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


def lingering_drivers(pods: Sequence[dict[str, Any]], current_uids: set[str]) -> list[str]:
    """Driver pods still running for an application that is gone or stale.

    spark-operator lets a deleted SparkApplication go as soon as it has *asked* for its driver pod's
    deletion; the driver keeps writing through its grace period. A successor must not start before it
    has stopped, or two writers own the same partitions (docs/scaling.md).
    """
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if phase not in ("Succeeded", "Failed") and not owners & current_uids:
            out.append(str(meta.get("name")))
    return sorted(out)
