"""A test run killed outright takes its servers with it (glasspipe_dev.reaper): a process that started a real
ClickHouse and a process group is SIGKILLed, and the server, the group and the server's temporary folder go too;
a group stopped normally, or whose leader's pid now belongs to another process, is left alone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from glasspipe_dev.reaper import process_start_time, read_stat, serve
from operator_harness import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

_OWNER = '''
import json, os, sys, time
from pathlib import Path
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.process import ServerProcess
from glasspipe_dev.reaper import reaper_pid

ch = ClickHouseServer().start()
group = ServerProcess("pair", ["sh", "-c", "sleep 600 & exec sleep 600"], Path(sys.argv[1]) / "pair.log").start()
forked = os.fork() if sys.argv[2:] == ["fork"] else None  # a multiprocessing worker's way: a copy of this process
if forked == 0:
    time.sleep(600)
    os._exit(0)
print(json.dumps({"clickhouse": ch.pid, "workdir": str(ch.workdir), "group": group.proc.pid,
                  "reaper": reaper_pid(), "forked": forked}), flush=True)
time.sleep(600)
'''


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := read_stat(entry / "stat")) is not None:
            fields = stat[1]
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def _alive(pid: int) -> bool:
    stat = read_stat(f"/proc/{pid}/stat")
    return stat is not None and stat[1][0] != "Z"


@pytest.mark.parametrize("fork", [False, True], ids=["alone", "with-a-forked-child"])
def test_servers_die_with_a_killed_owner(tmp_path: Path, fork: bool) -> None:
    """With a forked child too (bench/join_state.py's generator): the child, which lives on, holds no copy of the
    reaper's pipe, so the owner's servers still go when the owner dies."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "dev"), os.environ.get("PYTHONPATH", "")])}
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(tmp_path), *(["fork"] if fork else [])],
                             stdout=subprocess.PIPE, text=True, env=env)
    forked = None
    try:
        assert owner.stdout is not None
        started = json.loads(owner.stdout.readline())
        forked = started["forked"]
        group = started["group"]
        assert _alive(started["clickhouse"]) and Path(started["workdir"]).is_dir()
        wait_for(lambda: len(_group_members(group)) == 2, "the shell's background sleep and its exec'd one", timeout=15)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        wait_for(lambda: not _alive(started["clickhouse"]), "ClickHouse to die with its killed owner", timeout=15)
        wait_for(lambda: not _group_members(group), f"group {group} to die with its owner", timeout=15)
        wait_for(lambda: not Path(started["workdir"]).exists(), "the server's temporary folder to go", timeout=15)
        wait_for(lambda: not _alive(started["reaper"]), "the reaper to end after its work", timeout=15)
        if fork:
            assert _alive(forked), "the forked child lives on"  # else its death, not the owner's, freed the pipe
    finally:
        if owner.poll() is None:
            owner.kill()
        if forked:
            with contextlib.suppress(ProcessLookupError):
                os.kill(forked, signal.SIGKILL)


def test_a_reused_pid_is_not_killed() -> None:
    """The reaper kills a group only while its leader is the process registered: a pid reused by another process
    (pid_max is 32 768 here) is spared, and the registered one is killed."""
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        start = process_start_time(other.pid)
        assert start
        serve([f"+group {other.pid} {int(start) - 1}\n"])  # registered: an earlier process with this pid
        time.sleep(0.2)
        assert other.poll() is None, "a process that only shares a registered pid was killed"
        serve([f"+group {other.pid} {start}\n", f"-group {other.pid}\n"])  # stopped normally: forgotten
        time.sleep(0.2)
        assert other.poll() is None, "a forgotten group was killed"
        serve([f"+group {other.pid} {start}\n"])
        assert other.wait(timeout=5) == -signal.SIGKILL
    finally:
        if other.poll() is None:
            other.kill()
