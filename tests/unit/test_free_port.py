"""free_port hands out ports no other test worker and no outgoing connection can take."""

from __future__ import annotations

import socket

import pytest

from glasspipe_dev import process
from glasspipe_dev.process import free_port


def _ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


@pytest.mark.parametrize("worker, start", [("gw0", 22000), ("gw1", 24000), ("", 20000)])
def test_each_worker_draws_from_its_own_block_below_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch, worker: str, start: int
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setattr(process, "_next_port", [])
    ports = [free_port() for _ in range(50)]
    assert all(start <= p < start + 2000 for p in ports), ports
    assert len(set(ports)) == 50
    assert max(ports) < _ephemeral_low()


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setattr(process, "_next_port", [])
    first = free_port()
    monkeypatch.setattr(process, "_next_port", [first - 28000])  # the same start once more
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", first))
        taken.listen()
        assert free_port() == 28000 + (first - 28000 + 1) % 2000
