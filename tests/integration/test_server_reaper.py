"""A test run killed outright takes its servers with it (glasspipe_dev.reaper): a process that started a real
ClickHouse and a process group is SIGKILLed, and the server, the group and the server's temporary folder go too;
a group stopped normally, or whose leader's pid now belongs to another process, is left alone. So do a killed
process's local Spark scratch folder and a real node cluster's running pod, with containerd's shim (in a session of
its own), the pod's cgroups, the CNI bridge and the cluster's folder."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from glasspipe_dev.reaper import (
    CGROUP_FS,
    cgroup_pids,
    journal_dir,
    process_start_time,
    read_stat,
    serve,
    shim_pids,
)
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


_SPARK_OWNER = '''
import json, time
from pathlib import Path
from glasspipe_dev.spark import local_spark_session

session = local_spark_session("reaper-test")
assert session.range(3).count() == 3
jvm = session.sparkContext._jvm
print(json.dumps({"scratch": str(Path(session.conf.get("spark.local.dir")).parent),
                  "jvm": jvm.ProcessHandle.current().pid(),
                  "tmpdir": jvm.System.getProperty("java.io.tmpdir")}), flush=True)
time.sleep(600)
'''

_NODE_OWNER = '''
import json, time
from glasspipe_dev.cluster import PAUSE_IMAGE, Cluster
from glasspipe_dev.reaper import cgroup_pids, shim_pids

cluster = Cluster().start()
pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "held", "namespace": "default"},
       "spec": {"containers": [{"name": "held", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}]}}
cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
cluster.kubectl("wait", "--for=condition=Ready", "pod/held", "--timeout=120s")
print(json.dumps({"dir": str(cluster.dir), "socket": str(cluster.sock), "cgroup": cluster.cgroup_root,
                  "bridge": cluster.net.bridge, "shims": shim_pids(str(cluster.sock)),
                  "pods": cgroup_pids(cluster.cgroup_root)}), flush=True)
time.sleep(600)
'''

_HELD_OWNER = '''
import json, time
from glasspipe_dev.process import ServerProcess
from glasspipe_dev.reaper import reaper_pid, temp_dir_at_exit

folder = temp_dir_at_exit("gp-reaper-test-")
group = ServerProcess("held", ["sleep", "600"], folder / "held.log").start()
print(json.dumps({"folder": str(folder), "group": group.proc.pid, "reaper": reaper_pid()}), flush=True)
time.sleep(600)
'''


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # swept meanwhile
        return ""


def _keeps(journal: Path, folder: Path, group: int) -> bool:
    """Whether a reaper's list on disk holds both: the owner sends the group after the folder, and a loaded reaper
    may not have read that line yet when the folder is already on disk (CI's run of 3b578db killed it then)."""
    try:
        doc = json.loads(_text(journal) or "{}")
    except ValueError:  # caught between writes
        return False
    return str(folder) in doc.get("folder", []) and str(group) in doc.get("group", {})


def _run_a_reaper() -> None:
    """A reaper started and ended at once, as any process that starts a server starts one: it sweeps first."""
    subprocess.run([sys.executable, "-S", str(REPO / "dev" / "glasspipe_dev" / "reaper.py")], input=b"",
                   timeout=60, check=True)


def _gone_after_a_reaper(group: int) -> bool:
    _run_a_reaper()
    return not _group_members(group)


def _start_owner(script: str, *args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A process that runs ``script`` (which prints one JSON line once its servers are up) and then sleeps."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "dev"), str(REPO / "sparkapp"),
                                                        os.environ.get("PYTHONPATH", "")])}
    owner = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True, env=env)
    assert owner.stdout is not None
    line = owner.stdout.readline()
    if not line:
        owner.wait(timeout=10)
        pytest.fail(f"the owner exited {owner.returncode} before its servers were up (its stderr is above)")
    return owner, json.loads(line)


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
    owner, started = _start_owner(_OWNER, str(tmp_path), *(["fork"] if fork else []))
    forked = started["forked"]
    try:
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


def test_a_killed_owners_spark_scratch_goes() -> None:
    """local_spark_session's scratch folder (warehouse, spark.local.dir, Derby, and java.io.tmpdir, where RocksDB
    and LZ4 unpack their native libraries) goes with a killed owner, whose driver JVM ends as its stdin closes; an
    atexit hook alone never runs on SIGKILL."""
    owner, started = _start_owner(_SPARK_OWNER)
    try:
        assert Path(started["scratch"]).is_dir() and _alive(started["jvm"])
        assert started["tmpdir"] == started["scratch"]
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        wait_for(lambda: not _alive(started["jvm"]), "the driver JVM to end with its owner", timeout=30)
        wait_for(lambda: not Path(started["scratch"]).exists(), "the Spark scratch folder to go", timeout=15)
    finally:
        if owner.poll() is None:
            owner.kill()


def _cgroups(root: str) -> list[Path]:
    return [h / root.lstrip("/") for h in CGROUP_FS.iterdir() if (h / root.lstrip("/")).is_dir()]


def test_a_killed_owners_node_cluster_goes() -> None:
    """A real node with a running pod: containerd's shim runs in a session of its own and the pod's process in the
    cluster's cgroup, so killing the owner's process groups would leave both (and the cgroups, the CNI bridge and
    the cluster's folder) behind. The reaper takes them all."""
    owner, started = _start_owner(_NODE_OWNER)
    try:
        socket, root = started["socket"], started["cgroup"]
        assert started["shims"] and started["pods"], started
        assert _cgroups(root) and Path(f"/sys/class/net/{started['bridge']}").exists()
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        wait_for(lambda: not any(_alive(p) for p in started["shims"] + started["pods"]),
                 "the pod and its shim to die with the owner", timeout=30)
        assert not shim_pids(socket)
        wait_for(lambda: not cgroup_pids(root), f"no process left in cgroup {root} (a zombie until reaped)", timeout=30)
        wait_for(lambda: not _cgroups(root), f"the cgroups {root} to go", timeout=15)
        wait_for(lambda: not Path(f"/sys/class/net/{started['bridge']}").exists(), "the CNI bridge to go", timeout=15)
        wait_for(lambda: not Path(started["dir"]).exists(), "the cluster's folder to go", timeout=30)
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


def test_a_registered_command_runs_unless_forgotten(tmp_path: Path) -> None:
    """``+command`` (tests/fixtures_images.removed_container's ``podman rm``) runs at the end, ``-command`` takes it
    off; a command that fails or is missing does not stop the rest of the clean-up."""
    ran, forgotten, folder = tmp_path / "ran", tmp_path / "forgotten", tmp_path / "folder"
    folder.mkdir()
    serve([f"+command {json.dumps(['touch', str(forgotten)])}\n", f"+command {json.dumps(['false'])}\n",
           f"+command {json.dumps(['/no/such/program'])}\n", f"+command {json.dumps(['touch', str(ran)])}\n",
           f"-command {json.dumps(['touch', str(forgotten)])}\n", f"+folder {folder}\n"])
    assert ran.exists() and not forgotten.exists() and not folder.exists()


def test_a_killed_reapers_clean_up_falls_to_the_next_reaper() -> None:
    """``pkill -9 -f python`` kills the reaper (a python process) with its owner, whose servers then ran on for good.
    The reaper keeps its registry on disk under a lock held for its life; the next reaper to start finds the lock
    free and the owner gone, and cleans up in its place. While the owner lives, its servers are left alone."""
    owner, started = _start_owner(_HELD_OWNER)
    folder = Path(started["folder"])
    try:
        wait_for(lambda: any(_keeps(j, folder, started["group"]) for j in journal_dir().glob("reaper-*.json")),
                 "the owner's reaper to keep its folder and its group on disk", timeout=15)
        os.kill(started["reaper"], signal.SIGKILL)
        time.sleep(0.5)
        _run_a_reaper()
        assert _group_members(started["group"]) and folder.is_dir(), "a live owner's servers were cleaned up"
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(timeout=10)
        # Each poll starts a reaper: another test's reaper may hold the lock in its own sweep, begun while the owner
        # lived, at the moment ours tries it (a sweep skips a lock it cannot take); the sweep after that cleans up.
        wait_for(lambda: _gone_after_a_reaper(started["group"]), "the next reaper to kill the group", timeout=20,
                 interval=1.0)
        wait_for(lambda: not folder.exists(), "the next reaper to remove the folder", timeout=15)
    finally:
        if owner.poll() is None:
            owner.kill()
        with contextlib.suppress(OSError):
            os.killpg(started["group"], signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
