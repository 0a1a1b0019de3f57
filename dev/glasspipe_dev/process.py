"""Start a server process with its log in a file, wait until it is ready, stop it for sure."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

from glasspipe_dev.reaper import forget_group, kill_group_at_exit, remove_folder, temp_dir_at_exit

# Ports handed out below the kernel's ephemeral range, a block per pytest-xdist worker: a port from
# bind(0) is ephemeral, so another worker's bind(0) or any outgoing connection (a Kafka client's) could
# take it between our close and the server's bind (seen: a driver's metrics port, EADDRINUSE).
_PORT_BLOCK = 2000
_PORT_BASE = 20000
_next_port: list[int] = []


def _port_block() -> range:
    """This process's block of ports: one per pytest-xdist worker, and one for everything else."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    slot = int(worker[2:]) % 5 + 1 if worker[:2] == "gw" and worker[2:].isdigit() else 0
    start = _PORT_BASE + slot * _PORT_BLOCK
    return range(start, start + _PORT_BLOCK)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on and that no other test worker hands out.

    Ports come round-robin from this worker's block (starting at a point set by the pid, so two
    processes of one worker rarely meet), so a port just handed out is not handed out again soon."""
    block = _port_block()
    if not _next_port:
        _next_port.append(os.getpid() * 7919 % len(block))
    for _ in range(len(block)):
        port = block[_next_port[0] % len(block)]
        _next_port[0] += 1
        if _bindable(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # the whole block is busy
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (for a server that listens on several)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def log_tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file, or "(no log)"."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class ServerProcess:
    """A child process in its own process group, logging to ``log_path``; killed with its group should this process
    die without stopping it (glasspipe_dev.reaper)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        own_temp_dir: bool = False,
    ) -> None:
        """``own_temp_dir``: the child's TMPDIR is a folder of its own, removed once it has stopped or been killed
        (a Spark driver's scratch, which a killed JVM leaves behind)."""
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.own_temp_dir = own_temp_dir
        self.temp_dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.own_temp_dir:
            self.temp_dir = temp_dir_at_exit("gp-tmp-")
            self.env["TMPDIR"] = str(self.temp_dir)
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
        )
        log.close()
        kill_group_at_exit(self.proc.pid)
        return self

    def wait_ready(self, check: Callable[[], bool], timeout: float, what: str = "") -> None:
        """Poll ``check`` until it is true; fail with the log's tail if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {self.proc.returncode} before it was ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                if check():
                    return
            except Exception:  # readiness probes may fail in many ways while starting
                pass
            time.sleep(0.2)
        raise TimeoutError(
            f"{self.name} not ready after {timeout:.0f} s {what}; log {self.log_path}:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0, *, term_group: bool = True) -> None:
        """SIGTERM the whole process group (or only its leader, ``term_group=False``, for a leader that stops its
        own children), then SIGKILL the group if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            self._remove_temp_dir()
            return
        pgid = os.getpgid(self.proc.pid)
        if term_group:
            os.killpg(pgid, signal.SIGTERM)
        else:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        forget_group(pgid)
        self._remove_temp_dir()

    def kill(self) -> None:
        """SIGKILL the process group: a crash, not a shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
            forget_group(self.proc.pid)
        self._remove_temp_dir()

    def _remove_temp_dir(self) -> None:
        if self.temp_dir is not None and self.proc is not None and self.proc.poll() is not None:
            remove_folder(self.temp_dir)
            self.temp_dir = None


class RestartableServer:
    """Lifecycle shared by the local servers: stop/kill/restart on the same ports and data, close, ``with``.

    Subclasses set ``_process`` (a ServerProcess, or None before the first start) and ``workdir`` and
    ``_own_workdir`` (through :meth:`_set_workdir`), and implement ``start()`` (re-entrant: it starts again after
    stop() or kill()).
    """

    host = "127.0.0.1"
    _process: ServerProcess | None
    workdir: Path
    _own_workdir: bool

    def start(self) -> Self:
        raise NotImplementedError

    def _set_workdir(self, workdir: Path | None, prefix: str) -> None:
        """``workdir``, or a temporary folder of ours: removed by close(), or should this process die first."""
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else temp_dir_at_exit(prefix)

    def running(self) -> bool:
        return self._process is not None and self._process.alive()

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (benchmarks read its CPU time from /proc)."""
        proc = self._process.proc if self._process is not None else None
        return proc.pid if proc is not None and proc.poll() is None else None

    def _wait_port_free(self, port: int, timeout: float = 15.0) -> None:
        """After a stop the old process's socket can linger briefly; someone else may have taken it."""
        deadline = time.monotonic() + timeout
        while port_open(port, self.host):
            if time.monotonic() > deadline:
                raise RuntimeError(f"port {port} is taken by another process; cannot (re)start {type(self).__name__} "
                                   "on it")
            time.sleep(0.2)

    def stop(self, timeout: float = 30.0) -> None:
        """A clean shutdown (SIGTERM); the data folder and ports are kept for start()."""
        if self._process is not None:
            self._process.stop(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL: a crash. start() afterwards recovers from the data folder as a real server would."""
        if self._process is not None:
            self._process.kill()

    def restart(self, down_for: float = 0.0) -> None:
        """stop(), stay down ``down_for`` seconds, start() again on the same ports and data."""
        self.stop()
        if down_for > 0:
            time.sleep(down_for)
        self.start()

    def close(self) -> None:
        """Stop for good and remove the temporary folder (only if we created it)."""
        self.stop()
        if self._own_workdir:
            remove_folder(self.workdir)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
