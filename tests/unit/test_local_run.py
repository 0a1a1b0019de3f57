"""``glasspipe run``'s Ctrl-C: a clean stop first, a stop at once on the second (exit 130, said in one line)."""

from __future__ import annotations

import threading

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
