"""``glasspipe run``'s Ctrl-C: a clean stop first, a stop at once on the second."""

from __future__ import annotations

import threading

import pytest

from glasspipe_job.local import stop_on_ctrl_c


def test_the_first_ctrl_c_asks_for_a_clean_stop_and_the_second_stops_at_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    stop = threading.Event()
    stop_on_ctrl_c(stop)
    assert stop.is_set()
    assert "Ctrl-C again to stop now" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):
        stop_on_ctrl_c(stop)
