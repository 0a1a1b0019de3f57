"""Session-scoped real ClickHouse server for integration tests (wired in via pytest_plugins).

The server is Debian's clickhouse-server, installed by dev/install/clickhouse.sh. A missing
install fails the test run loudly (never a skip): integration tests must talk to the real thing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from glasspipe_dev.clickhouse import INSTALL_HINT, ClickHouseServer
from server_fixture import started_server


@pytest.fixture(scope="session")
def clickhouse() -> Iterator[ClickHouseServer]:
    """A started ClickHouseServer on free loopback ports with a temporary data folder."""
    yield from started_server(ClickHouseServer, "ClickHouse", INSTALL_HINT)
