"""CPU seconds of a process tree per kind of thread (Spark tasks, JIT compilers, garbage collector, the driver's
Python, ...), read from /proc while the tree runs: JFR samples only Java frames, so RocksDB's native work,
the JIT and the collector are missing from a JVM profile; this counts them all.

    with ThreadCpu(proc.pid) as cpu:
        proc.wait()
    cpu.print_summary()
"""

from __future__ import annotations

import os
import threading

from glasspipe_dev.reaper import read_stat

# Linux keeps 15 characters of a thread's name; the JVM names its native threads after the Java ones.
GROUPS = [
    ("Spark tasks (Executor task launch worker: Kafka read, JSON, dedup state, shuffle, Arrow)", ("Executor task",)),
    ("JIT compiler (C1, C2)", ("CompilerThre", "C1 Compil", "C2 Compil")),
    ("garbage collector", ("GC Thread", "G1 ", "VM Periodic", "GC ")),
    ("stream execution thread (planning, offsets, commit logs)", ("stream executi",)),
    ("driver Python (foreachBatch: sink, dead letters)", ("python",)),
    ("RocksDB background (flush, compaction)", ("rocksdb",)),
    ("Kafka clients", ("kafka", "adminclient")),
]
_CLK = os.sysconf("SC_CLK_TCK")


def process_parents() -> dict[int, int]:
    """pid -> parent pid of every process now (bench/bulk.py finds its children with it too)."""
    parents: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (stat := read_stat(f"/proc/{d}/stat")) is not None:
            parents[int(d)] = int(stat[1][1])
    return parents


def descendants(root: int) -> set[int]:
    """``root`` and every process below it now."""
    parents = process_parents()
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


def _stat(path: str) -> tuple[str, float] | None:
    """(name, CPU seconds so far) from a /proc stat file; None once the process or thread is gone."""
    if (stat := read_stat(path)) is None:
        return None
    name, fields = stat
    return name, (int(fields[11]) + int(fields[12])) / _CLK


def thread_group(name: str) -> str:
    """The GROUPS label a thread's name belongs to; else "other: " and the name without its trailing number."""
    return next((g for g, marks in GROUPS if any(m in name for m in marks)), "other: " + name.rstrip("0123456789#-"))


def thread_cpus(pid: int) -> dict[int, tuple[str, float]]:
    """tid -> (name, CPU seconds so far) of each live thread of one process; empty once it is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    return {int(tid): st for tid in tids if (st := _stat(f"/proc/{pid}/task/{tid}/stat")) is not None}


def process_cpu(pid: int) -> float | None:
    """CPU seconds one process has used so far; None once it is gone."""
    st = _stat(f"/proc/{pid}/stat")
    return None if st is None else st[1]


def tree_cpu(root: int | None) -> float:
    """CPU seconds the live processes of the tree under ``root`` have used so far (0 for None)."""
    stats = (_stat(f"/proc/{pid}/stat") for pid in (descendants(root) if root is not None else ()))
    return sum(st[1] for st in stats if st is not None)


class ThreadCpu(threading.Thread):
    """Polls the tree under ``root`` every ``interval`` s; keeps each thread's last CPU time (a thread's
    time only grows, so the last reading before it ends is its total, up to one interval)."""

    def __init__(self, root: int, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.seen: dict[tuple[int, int], tuple[str, float]] = {}
        self._done = threading.Event()

    def sample(self) -> None:
        for pid in descendants(self.root):
            for tid, st in thread_cpus(pid).items():
                self.seen[(pid, tid)] = st

    def run(self) -> None:
        while not self._done.wait(self.interval):
            self.sample()

    def __enter__(self) -> ThreadCpu:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self.join()

    def by_group(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, cpu in self.seen.values():
            group = thread_group(name)
            out[group] = out.get(group, 0.0) + cpu
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def print_summary(self, events: int) -> None:
        groups = self.by_group()
        total = sum(groups.values())
        print(f"  CPU per kind of thread ({total:.1f} CPU-s sampled, {total / events * 1e6:,.0f} per M events):")
        for group, cpu in list(groups.items())[:12]:
            print(f"    {cpu:7.1f} s {100 * cpu / max(total, 1e-9):5.1f} %  {group}")


class CpuWindow:
    """CPU seconds each named process tree used between ``__enter__`` and ``__exit__`` (``trees``), and those of
    the tree ``by_thread`` per kind of thread (``threads``)."""

    def __init__(self, roots: dict[str, int | None], by_thread: str) -> None:
        self.roots = roots
        self.trees: dict[str, float] = {}
        self.threads: dict[str, float] = {}
        root = roots.get(by_thread)
        self._threads = ThreadCpu(root) if root is not None else None
        self._before: dict[str, float] = {}

    def __enter__(self) -> CpuWindow:
        self.trees = {k: tree_cpu(pid) for k, pid in self.roots.items()}
        if self._threads is not None:
            self._threads.sample()
            self._before = self._threads.by_group()
            self._threads.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.trees = {k: tree_cpu(pid) - self.trees[k] for k, pid in self.roots.items()}
        if self._threads is not None:
            self._threads.__exit__()
            self._threads.sample()
            self.threads = {g: v - self._before.get(g, 0.0) for g, v in self._threads.by_group().items()}
