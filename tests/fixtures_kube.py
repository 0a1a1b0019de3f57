"""Session fixture: one real kube-apiserver (+ etcd) for the integration tests that need Kubernetes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from glasspipe_dev.kube import KubeAPIServer
from glasspipe_dev.paths import NotInstalledError


@pytest.fixture(scope="session")
def kube() -> Iterator[KubeAPIServer]:
    """A started API server with RBAC; fails (never skips) when dev/install/kube.sh has not been run."""
    try:
        server = KubeAPIServer()
    except NotInstalledError as e:
        pytest.fail(f"Kubernetes API server not installed: {e}", pytrace=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()
