"""A test run killed outright takes its servers with it (glasspipe_dev.reaper): a process that started a real
ClickHouse and a process group is SIGKILLed, and the server, the group and the server's temporary folder go too;
a group stopped normally, or whose leader's pid now belongs to another process, is left alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from glasspipe_dev.reaper import process_start_time, serve

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

_OWNER = '''
import json, sys, time
from pathlib import Path
from glasspipe_dev.clickhouse import ClickHouseServer
from glasspipe_dev.process import ServerProcess
from glasspipe_dev.reaper import reaper_pid

ch = ClickHouseServer().start()
group = ServerProcess("pair", ["sh", "-c", "sleep 600 & exec sleep 600"], Path(sys.argv[1]) / "pair.log").start()
print(json.dumps({"clickhouse": ch.pid, "workdir": str(ch.workdir), "group": group.proc.pid,
                  "reaper": reaper_pid()}), flush=True)
time.sleep(600)
'''


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_until(check: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_servers_die_with_a_killed_owner(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "dev"), os.environ.get("PYTHONPATH", "")])}
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        assert owner.stdout is not None
        started = json.loads(owner.stdout.readline())
        group = started["group"]
        assert _alive(started["clickhouse"]) and Path(started["workdir"]).is_dir()
        assert _wait_until(lambda: len(_group_members(group)) == 2), "the shell's background sleep and exec'd one"
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        assert _wait_until(lambda: not _alive(started["clickhouse"])), "ClickHouse outlived its killed owner"
        assert _wait_until(lambda: not _group_members(group)), f"group {group} outlived its owner"
        assert _wait_until(lambda: not Path(started["workdir"]).exists()), "the server's temporary folder is left"
        assert _wait_until(lambda: not _alive(started["reaper"])), "the reaper lingers after its work"
    finally:
        if owner.poll() is None:
            owner.kill()


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
