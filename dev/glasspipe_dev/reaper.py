"""Servers that do not outlive the process that started them, even when it dies without closing them.

A test run killed with SIGKILL (``pkill -9 -f pytest``, a CI timeout, the OOM killer) never runs its fixtures'
``close()``: its Kafka, ClickHouse, pipelines and Kubernetes parts run on in their own sessions, and the next run or
benchmark shares the machine with them. So each process that starts servers starts one reaper beside it: a small
process in its own session that reads what to clean up from a pipe: process groups, temporary folders, the parts of
a node cluster that are no group of ours (containerd's shims, which leave containerd's session by design; the pods'
cgroups; the CNI bridge), and commands that remove what only its own tool can (``podman rm`` of a container, which
podman's conmon keeps running without the ``podman run`` that started it). A pipe's reader sees end-of-file when its
last writer dies, whatever killed it; the reaper then SIGKILLs each group still registered, each shim and each
process in a registered cgroup, runs each command, and removes the cgroups, the bridge and each folder. A part
stopped normally is taken off its list first. The reaper keeps its list on disk too: should it be killed itself
(``pkill -9 -f python``), the next reaper to start does its work once its owner is gone (:class:`Journal`).

This file runs as a script (``python reaper.py``) so that it needs nothing on the reaper's import path.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CGROUP_FS = Path("/sys/fs/cgroup")


def read_stat(path: str | Path) -> tuple[str, list[str]] | None:
    """A ``/proc/.../stat`` file's command name and the fields after it (``fields[0]`` is field 3, the state), or
    None once the process or thread is gone. The name may hold spaces and ")", so it ends at the last ")"."""
    try:
        stat = Path(path).read_text()
    except OSError:
        return None
    name, _, rest = stat.partition("(")[2].rpartition(")")
    return name, rest.split()


def process_start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), or "" if it is gone.

    A pid is reused once its process is reaped (pid_max is 32 768 here), so a group is only killed while its leader
    is the process that was registered, or while the group still has members (its id is then not reusable)."""
    stat = read_stat(f"/proc/{pid}/stat")
    return stat[1][19] if stat is not None else ""


def cgroup_pids(root: str) -> list[int]:
    """The processes in cgroup ``root`` and below it (cgroup v1's pids hierarchy)."""
    pids: set[int] = set()
    base = CGROUP_FS / "pids" / root.lstrip("/")
    if base.is_dir():
        for procs in base.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids.update(int(x) for x in procs.read_text().split())
    return sorted(pids)


def remove_cgroups(root: str) -> None:
    """Remove cgroup ``root`` and those below it in every hierarchy, deepest first (one with processes stays)."""
    for hierarchy in CGROUP_FS.iterdir():
        base = hierarchy / root.lstrip("/")
        if not base.is_dir():
            continue
        for sub in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                sub.rmdir()
        with contextlib.suppress(OSError):
            base.rmdir()


def shim_pids(socket: str) -> list[int]:
    """The shims of the containerd on ``socket``: they outlive containerd by design, and name its socket."""
    found = []
    needle = socket.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"containerd-shim" in argv[0] and needle in argv:
            found.append(int(entry.name))
    return found


def delete_bridge(bridge: str, lock: str) -> None:
    """Delete network link ``bridge`` unless another cluster holds ``lock`` by now (the bridge is then its own): a
    cluster takes the lock before it looks for the bridge, so holding the lock makes the look and the delete one."""
    with contextlib.suppress(OSError), open(lock, "a") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        delete_link(bridge)


def delete_link(name: str) -> None:
    """Delete network link ``name`` if the host has it."""
    if Path(f"/sys/class/net/{name}").exists():
        subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)


def empty_cgroups(root: str, timeout: float = 10.0) -> None:
    """SIGKILL each process in cgroup ``root`` and below it, until none is left, then remove the cgroups. A killed
    process stays in its cgroup (a zombie) until its parent reaps it: with its shim killed too, that is init."""
    deadline = time.monotonic() + timeout
    while (left := cgroup_pids(root)) and time.monotonic() < deadline:
        kill_all(left)
        time.sleep(0.1)
    remove_cgroups(root)


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Registry:
    """What a reaper cleans up at its owner's end: registered with ``+KIND ARG``, forgotten with ``-KIND ARG``, KIND
    one of ``group`` (ARG: PGID START; forgotten by PGID), ``shims`` (containerd's socket), ``cgroup`` (a root),
    ``bridge`` (NAME LOCK; forgotten by NAME), ``command`` (an argv as JSON) and ``folder`` (a path)."""

    def __init__(self) -> None:
        self.groups: dict[str, str] = {}  # pgid -> its leader's start time
        self.bridges: dict[str, str] = {}  # name -> its index's lock
        self.sets: dict[str, set[str]] = {"shims": set(), "cgroup": set(), "command": set(), "folder": set()}

    def apply(self, line: str) -> None:
        op, _, arg = line.rstrip("\n").partition(" ")
        sign, kind = op[:1], op[1:]
        pairs = {"group": self.groups, "bridge": self.bridges}.get(kind)
        if pairs is not None and sign == "+":
            name, value = arg.split(" ", 1)
            pairs[name] = value
        elif pairs is not None:
            pairs.pop(arg, None)
        elif kind in self.sets and sign == "+":
            self.sets[kind].add(arg)
        elif kind in self.sets:
            self.sets[kind].discard(arg)

    def to_doc(self) -> dict[str, object]:
        return {"group": self.groups, "bridge": self.bridges, **{k: sorted(v) for k, v in self.sets.items()}}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Registry:
        registry = cls()
        registry.groups, registry.bridges = dict(doc.get("group", {})), dict(doc.get("bridge", {}))
        for kind in registry.sets:
            registry.sets[kind] = set(doc.get(kind, ()))
        return registry

    def clean_up(self) -> None:
        for pgid, started in self.groups.items():
            now = process_start_time(int(pgid))
            if now and now != started:
                continue  # the leader is gone and its pid belongs to another process, which leads no group of ours
            with contextlib.suppress(OSError):  # the whole group is gone
                os.killpg(int(pgid), signal.SIGKILL)
        for socket in self.sets["shims"]:
            kill_all(shim_pids(socket))
        for root in self.sets["cgroup"]:
            empty_cgroups(root)
        for bridge, lock in self.bridges.items():
            delete_bridge(bridge, lock)
        for command in self.sets["command"]:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(json.loads(command), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=120, check=False)
        for folder in self.sets["folder"]:
            shutil.rmtree(folder, ignore_errors=True)


def journal_dir() -> Path:
    return Path(tempfile.gettempdir()) / "glasspipe-reapers"


class Journal:
    """A reaper's registry and its owner on disk (``reaper-*.json``) beside a lock (``reaper-*.lock``) it holds for
    its life. The reaper itself may be killed (``pkill -9 -f python`` matches it too): its owner's servers then run on
    when the owner dies, and the next reaper to start finds the lock free and the owner gone, and cleans up in its
    place (:func:`sweep`)."""

    def __init__(self, folder: Path, owner: int) -> None:
        self.owner = [owner, process_start_time(owner)]
        folder.mkdir(parents=True, exist_ok=True)
        fd, hidden = tempfile.mkstemp(dir=folder, prefix=".reaper-", suffix=".lock")
        fcntl.flock(fd, fcntl.LOCK_EX)
        self.lock = folder / Path(hidden).name[1:]
        os.rename(hidden, self.lock)  # seen under its name only once locked: a sweep never takes a live reaper's
        self._fd = fd
        self.path = self.lock.with_suffix(".json")

    def save(self, registry: Registry) -> None:
        hidden = self.path.with_name(f".{self.path.name}")
        hidden.write_text(json.dumps({"owner": self.owner, **registry.to_doc()}))
        os.replace(hidden, self.path)

    def close(self) -> None:
        """After the clean-up: nothing is left for a sweep."""
        self.path.unlink(missing_ok=True)
        self.lock.unlink(missing_ok=True)
        os.close(self._fd)


def sweep(folder: Path) -> None:
    """Clean up for each reaper whose lock is free (it was killed, and its registry is what it left to do) and whose
    owner is gone (a live owner still uses its servers, and the owner starts a new reaper for what it starts next)."""
    for lock in sorted(folder.glob("reaper-*.lock")):
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue  # another sweep took it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # its reaper lives
        try:
            path = lock.with_suffix(".json")
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError):
                doc = {}  # killed before its first line: nothing registered
            owner, started = doc.get("owner", [0, ""])
            if lock.exists() and not (owner and process_start_time(owner) == started):
                Registry.from_doc(doc).clean_up()
                for done in (path.with_name(f".{path.name}"), path, lock):
                    done.unlink(missing_ok=True)
        finally:
            os.close(fd)


def serve(lines: list[str] | None = None, journal: Path | None = None) -> None:
    """The reaper's loop: a :class:`Registry` line a line on stdin; at end-of-file, clean up what is left. With a
    ``journal`` folder, first clean up for the killed reapers there, then keep the registry there."""
    registry = Registry()
    kept = Journal(journal, os.getppid()) if journal is not None else None
    if journal is not None:
        sweep(journal)
    for line in lines if lines is not None else sys.stdin:
        registry.apply(line)
        if kept is not None:
            kept.save(registry)
    registry.clean_up()
    if kept is not None:
        kept.close()


class _Reaper:
    """This process's reaper, started on first use (and again in a forked child, which needs its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner = 0
        self._proc: subprocess.Popen[bytes] | None = None

    def _send(self, line: str) -> None:
        with self._lock:
            if self._owner != os.getpid() or self._proc is None or self._proc.poll() is not None:
                self._proc = subprocess.Popen(
                    [sys.executable, "-S", str(Path(__file__).resolve())],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    start_new_session=True,  # Ctrl-C or a signal to the test run's group does not reach it
                )
                self._owner = os.getpid()
            assert self._proc.stdin is not None
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()

    def pid(self) -> int | None:
        """The reaper's pid, once started (tests kill the owner and watch the reaper act)."""
        return self._proc.pid if self._proc is not None and self._owner == os.getpid() else None

    def drop_inherited(self) -> None:
        """In a child forked from the owner (a ``multiprocessing`` worker): close the copy of the owner's pipe, or the
        reaper would see end-of-file only once the child ends too, and the owner's servers would outlive the owner by
        as long as the child runs. The child starts a reaper of its own if it starts servers."""
        proc, self._proc = self._proc, None
        self._lock = threading.Lock()  # another thread of the owner may have held it at the fork
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.close()


_REAPER = _Reaper()
os.register_at_fork(after_in_child=_REAPER.drop_inherited)


def kill_group_at_exit(pgid: int) -> None:
    """SIGKILL process group ``pgid`` (led by the process ``pgid``) should this process die before
    :func:`forget_group`."""
    _REAPER._send(f"+group {pgid} {process_start_time(pgid)}")


def forget_group(pgid: int) -> None:
    _REAPER._send(f"-group {pgid}")


def remove_folder_at_exit(folder: Path) -> None:
    """Remove ``folder`` should this process die before :func:`forget_folder`."""
    _REAPER._send(f"+folder {folder}")


def forget_folder(folder: Path) -> None:
    _REAPER._send(f"-folder {folder}")


def temp_dir_at_exit(prefix: str) -> Path:
    """A new temporary folder, removed should this process die before :func:`remove_folder` removes it."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    remove_folder_at_exit(folder)
    return folder


def remove_folder(folder: Path) -> None:
    """Remove ``folder`` now, and take it off the reaper's list."""
    shutil.rmtree(folder, ignore_errors=True)
    forget_folder(folder)


def kill_node_at_exit(socket: Path, cgroup_root: str) -> None:
    """Kill the shims of the containerd on ``socket`` and each process in cgroup ``cgroup_root``, and remove the
    cgroups, should this process die before :func:`forget_node`."""
    _REAPER._send(f"+shims {socket}")
    _REAPER._send(f"+cgroup {cgroup_root}")


def forget_node(socket: Path, cgroup_root: str) -> None:
    _REAPER._send(f"-shims {socket}")
    _REAPER._send(f"-cgroup {cgroup_root}")


def delete_bridge_at_exit(bridge: str, lock: Path) -> None:
    """Delete network link ``bridge`` (unless another holds ``lock`` by then) should this process die before
    :func:`forget_bridge`."""
    _REAPER._send(f"+bridge {bridge} {lock}")


def forget_bridge(bridge: str) -> None:
    _REAPER._send(f"-bridge {bridge}")


def run_at_exit(argv: Sequence[str]) -> None:
    """Run ``argv`` (to its end, at most two minutes) should this process die before :func:`forget_command`."""
    _REAPER._send(f"+command {json.dumps(list(argv))}")


def forget_command(argv: Sequence[str]) -> None:
    _REAPER._send(f"-command {json.dumps(list(argv))}")


def reaper_pid() -> int | None:
    return _REAPER.pid()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve(journal=journal_dir())
