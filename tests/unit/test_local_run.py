"""``glasspipe run``'s Ctrl-C: a clean stop first, a stop at once on the second (exit 130, said in one line)."""

from __future__ import annotations

import ast
import threading
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest

import glasspipe_job.local
from glasspipe import cli
from glasspipe_job.local import stop_on_ctrl_c


def test_the_first_ctrl_c_asks_for_a_clean_stop_and_the_second_stops_at_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    stop = threading.Event()
    stop_on_ctrl_c(stop)
    assert stop.is_set()
    assert "Ctrl-C again to stop now" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):
        stop_on_ctrl_c(stop)


def test_a_run_stopped_at_once_says_so_and_exits_130(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(_: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(glasspipe_job.local, "run_local", interrupted)
    assert cli.main(["run", "pipeline.yaml"]) == 130
    assert "stopped at once" in capsys.readouterr().err


def test_a_plugged_command_that_cannot_load_says_why_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``run`` reaches the CLI as an entry point of the job; one whose package is missing must not break validate,
    render or crd, and says why when run instead of a traceback."""
    broken = EntryPoint(name="run", value="glasspipe_job.not_here:add_run_command", group=cli.COMMANDS_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [broken] if group == cli.COMMANDS_GROUP else [])
    assert cli.main(["run", "pipeline.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("glasspipe run is unavailable here: No module named 'glasspipe_job.not_here'")
    assert len(err.splitlines()) == 1
    assert cli.main(["crd"]) == 0


def test_the_installed_package_plugs_the_jobs_run_command_into_the_cli() -> None:
    """pyproject.toml's entry point names the job's command; the CLI imports nothing of the job itself."""
    (entry,) = [e for e in entry_points(group=cli.COMMANDS_GROUP) if e.name == "run"]
    assert entry.load() is glasspipe_job.local.add_run_command
    tree = ast.parse(Path(cli.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("glasspipe_job")}
