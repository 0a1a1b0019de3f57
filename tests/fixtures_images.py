"""Session fixtures for glasspipe's container images, run with podman (wired in via pytest_plugins).

The images are built by dev/install/images.sh (podman, cached: about a second when nothing changed,
a rebuild of the changed layers otherwise), which the fixture runs first so a test never runs an
image older than the code. They run through dev/images/podman.sh, the settings they were built with.
A failed build fails the run loudly, naming the script (never a skip).
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from glasspipe_dev.reaper import forget_command, run_at_exit

REPO = Path(__file__).resolve().parents[1]
INSTALL = "dev/install/images.sh"
PODMAN = ["bash", str(REPO / "dev" / "images" / "podman.sh")]
OPERATOR_REF = "docker.io/glasspipe/operator:0.1.0"
SPARK_REF = "docker.io/glasspipe/spark:0.1.0"


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """podman with the project's storage and runtime settings; raises with its output on failure."""
    done = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-6000:]}")
    return done


@contextlib.contextmanager
def removed_container(name: str) -> Iterator[str]:
    """``name`` for a container that runs on (``run_argv(name=...)``), removed when the block ends, or by
    glasspipe_dev.reaper should the test run be killed first: podman's conmon keeps a container running without the
    ``podman run`` that started it."""
    remove = [*PODMAN, "rm", "--force", "--ignore", "--time", "0", name]
    run_at_exit(remove)
    try:
        yield name
    finally:
        subprocess.run(remove, capture_output=True, timeout=120, check=False)
        forget_command(remove)


@dataclass(frozen=True)
class Image:
    """A built image and how to run a container of it."""

    ref: str

    def run_argv(self, *args: str, entrypoint: str | None = None, network: str = "none",
                 volumes: Sequence[str] = (), env: Mapping[str, str] | None = None, name: str | None = None,
                 user: str | None = None, read_only: bool = False) -> list[str]:
        """The podman run argv (for a container a test starts and stops itself)."""
        argv = ["run", "--rm", "--pull=never", f"--network={network}"]
        if read_only:
            argv.append("--read-only")
        if name:
            argv.append(f"--name={name}")
        if entrypoint is not None:
            argv.append(f"--entrypoint={entrypoint}")
        if user is not None:
            argv.append(f"--user={user}")
        for volume in volumes:
            argv += ["--volume", volume]
        for key, value in sorted((env or {}).items()):
            argv += ["--env", f"{key}={value}"]
        return [*PODMAN, *argv, self.ref, *args]

    def run(self, *args: str, entrypoint: str | None = None, network: str = "none", volumes: Sequence[str] = (),
            env: Mapping[str, str] | None = None, user: str | None = None, timeout: float = 180,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a container to its end; raises with its output when it fails and ``check`` is set. It is named and
        removed at the end, so one that outlives a timeout or a killed test run (conmon keeps it) goes too."""
        with removed_container(f"gp-run-{secrets.token_hex(6)}") as name:
            argv = self.run_argv(*args, entrypoint=entrypoint, network=network, volumes=volumes, env=env, user=user,
                                 name=name)
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv[2:])} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                                 f"{done.stderr[-6000:]}")
        return done

    def sh(self, script: str, timeout: float = 180) -> str:
        """stdout of a bash script run in the image (as the image's user, no network)."""
        return self.run("-c", script, entrypoint="bash", timeout=timeout).stdout


@pytest.fixture(scope="session")
def built_images() -> dict[str, Image]:
    """Both images, (re)built from the current sources by dev/install/images.sh."""
    done = subprocess.run(["bash", str(REPO / INSTALL)], capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        pytest.fail(f"`bash {INSTALL}` failed ({done.returncode}); the images are missing or stale:\n"
                    f"{done.stdout[-2000:]}\n{done.stderr[-6000:]}", pytrace=False)
    images = {}
    for ref in (OPERATOR_REF, SPARK_REF):
        if podman("image", "exists", ref, check=False).returncode != 0:
            pytest.fail(f"{ref} is not in podman's storage after `bash {INSTALL}`", pytrace=False)
        images[ref] = Image(ref)
    return images


@pytest.fixture(scope="session")
def operator_image(built_images: dict[str, Image]) -> Image:
    return built_images[OPERATOR_REF]


@pytest.fixture(scope="session")
def spark_image(built_images: dict[str, Image]) -> Image:
    return built_images[SPARK_REF]
