"""Servers that do not outlive the process that started them, even when it dies without closing them.

A test run killed with SIGKILL (``pkill -9 -f pytest``, a CI timeout, the OOM killer) never runs its fixtures'
``close()``: its Kafka, ClickHouse, pipelines and Kubernetes parts run on in their own sessions, and the next run or
benchmark shares the machine with them. So each process that starts servers starts one reaper beside it: a small
process in its own session that reads the process groups (and temporary folders) to clean up from a pipe. A pipe's
reader sees end-of-file when its last writer dies, whatever killed it; the reaper then SIGKILLs each group still
registered and removes each folder. A group stopped normally is taken off its list first.

This file runs as a script (``python reaper.py``) so that it needs nothing on the reaper's import path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path


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


def _clean_up(groups: dict[int, str], folders: set[str]) -> None:
    for pgid, started in groups.items():
        now = process_start_time(pgid)
        if now and now != started:
            continue  # the leader is gone and its pid belongs to another process, which leads no group of ours
        with contextlib.suppress(OSError):  # the whole group is gone
            os.killpg(pgid, signal.SIGKILL)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def serve(lines: list[str] | None = None) -> None:
    """The reaper's loop: ``+group PGID START``, ``-group PGID``, ``+folder PATH``, ``-folder PATH`` on stdin, one a
    line; at end-of-file, clean up what is left."""
    groups: dict[int, str] = {}
    folders: set[str] = set()
    for line in lines if lines is not None else sys.stdin:
        op, _, arg = line.rstrip("\n").partition(" ")
        if op == "+group":
            pgid, started = arg.split(" ", 1)
            groups[int(pgid)] = started
        elif op == "-group":
            groups.pop(int(arg), None)
        elif op == "+folder":
            folders.add(arg)
        elif op == "-folder":
            folders.discard(arg)
    _clean_up(groups, folders)


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


def reaper_pid() -> int | None:
    return _REAPER.pid()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    serve()
