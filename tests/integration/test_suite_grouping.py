"""The suite's own scheduling: dev/test.sh runs two pytest-xdist workers with `--dist loadgroup`, and
the tests marked xdist_group("node") must all land on one worker, or each worker starts its own node
cluster and the two kubelets collide on their fixed device-plugin socket. pytest 9.2 stopped reading
the node-id field pytest-xdist 3.8 writes the group into (pytest-dev/pytest-xdist#1386); pyproject.toml
pins pytest below it. This runs the installed pytest and pytest-xdist on a small suite and fails if
the grouping is lost again."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

_GROUPED = '''import pytest

pytestmark = pytest.mark.xdist_group("node")


def test_one(): pass
def test_two(): pass
def test_three(): pass
def test_four(): pass
'''

_FREE = "".join(f"def test_free_{i}(): pass\n" for i in range(4))


def test_loadgroup_runs_a_group_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(_GROUPED)
    (tmp_path / "test_free.py").write_text(_FREE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the rootdir: none of the project's settings
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    passed = re.findall(r"\[(gw\d+)\].*PASSED test_grouped\.py::(test_\w+)", run.stdout)
    workers = {name: worker for worker, name in passed}
    assert sorted(workers) == ["test_four", "test_one", "test_three", "test_two"], run.stdout
    assert len(set(workers.values())) == 1, f"the group ran on {sorted(set(workers.values()))}:\n{run.stdout}"
