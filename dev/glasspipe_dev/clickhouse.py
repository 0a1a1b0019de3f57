"""A throw-away ClickHouse server (Debian's 18.16 package) on free loopback ports.

We write our own small config into a temporary folder instead of reusing
/etc/clickhouse-server/config.xml: the packaged one points at /var/lib and /var/log, listens on
fixed ports 9000/8123/9009 and sizes its caches for a dedicated machine (5 GiB mark cache, 8 GiB
uncompressed cache), while this machine's 24 GiB are shared with Spark, Kafka and the API server.

stop() and start() can be called again and again: the ports and the data folder stay the same,
so tests can take ClickHouse away mid-run and bring it back with its tables intact.

With ``tls=`` the server also listens with TLS on ``secure_port`` (18.16 supports ``tcp_port_secure``
with an ``openSSL`` server section), and ``users=`` adds password users: what the security tests use.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

from glasspipe_dev.paths import NotInstalledError
from glasspipe_dev.process import RestartableServer, ServerProcess, free_ports, log_tail, port_open
from glasspipe_dev.tls import CertAndKey
from glasspipe_job.clickhouse.mechanism import parse_version

if TYPE_CHECKING:
    from clickhouse_driver import Client

INSTALL_HINT = "run `bash dev/install/clickhouse.sh` (apt-get installs Debian's clickhouse-server 18.16)"

_SERVER_CANDIDATES = ("/usr/sbin/clickhouse-server", "/usr/bin/clickhouse-server")

_MiB = 1024 * 1024

_CONFIG = """<?xml version="1.0"?>
<!-- Written by glasspipe_dev.clickhouse for one test server; not for production. -->
<yandex>
    <logger>
        <level>{log_level}</level>
        <log>{log_dir}/clickhouse-server.log</log>
        <errorlog>{log_dir}/clickhouse-server.err.log</errorlog>
        <size>100M</size>
        <count>2</count>
        <console>0</console>
    </logger>
    <listen_host>{listen_host}</listen_host>
    <tcp_port>{tcp_port}</tcp_port>
    <http_port>{http_port}</http_port>{secure}
    <max_connections>256</max_connections>
    <keep_alive_timeout>3</keep_alive_timeout>
    <max_concurrent_queries>64</max_concurrent_queries>
    <uncompressed_cache_size>{uncompressed_cache_size}</uncompressed_cache_size>
    <mark_cache_size>{mark_cache_size}</mark_cache_size>
    <path>{data_dir}/</path>
    <tmp_path>{data_dir}/tmp/</tmp_path>
    <user_files_path>{data_dir}/user_files/</user_files_path>
    <format_schema_path>{data_dir}/format_schemas/</format_schema_path>
    <users_config>{users_xml}</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mlock_executable>false</mlock_executable>
    <max_table_size_to_drop>0</max_table_size_to_drop>
    <max_partition_size_to_drop>0</max_partition_size_to_drop>
    <builtin_dictionaries_reload_interval>3600</builtin_dictionaries_reload_interval>
    <!-- On SIGTERM, wait this long (s) for open client connections (default 5; tests keep clients). -->
    <shutdown_wait_unfinished>2</shutdown_wait_unfinished>
</yandex>
"""

# background_pool_size is a profile setting in 18.x, read from the default profile at server start.
_USERS = """<?xml version="1.0"?>
<yandex>
    <profiles>
        <default>
            <max_memory_usage>{max_memory_usage}</max_memory_usage>
            <max_memory_usage_for_all_queries>{max_memory_usage_all}</max_memory_usage_for_all_queries>
            <max_threads>2</max_threads>
            <!-- idle native connections check for shutdown this often (s); default 10 delays stop() -->
            <poll_interval>1</poll_interval>
            <background_pool_size>4</background_pool_size>
            <background_schedule_pool_size>4</background_schedule_pool_size>
            <use_uncompressed_cache>0</use_uncompressed_cache>
            <load_balancing>random</load_balancing>
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks>
                <ip>127.0.0.1</ip>
                <ip>::1</ip>{extra_networks}
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>{extra_users}
    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries>
                <errors>0</errors>
                <result_rows>0</result_rows>
                <read_rows>0</read_rows>
                <execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</yandex>
"""


# TLS on the secure native port (ClickHouse 18.16 has it: tcp_port_secure and Poco's openSSL section). The
# server presents its certificate; clients verify it against their CA (no client certificates here).
_SECURE = """
    <tcp_port_secure>{port}</tcp_port_secure>
    <openSSL>
        <server>
            <certificateFile>{cert}</certificateFile>
            <privateKeyFile>{key}</privateKeyFile>
            <verificationMode>none</verificationMode>
            <loadDefaultCAFile>false</loadDefaultCAFile>
            <cacheSessions>true</cacheSessions>
            <disableProtocols>sslv2,sslv3,tlsv1,tlsv1_1</disableProtocols>
            <preferServerCiphers>true</preferServerCiphers>
        </server>
    </openSSL>"""

_USER = """
        <{name}>
            <password>{password}</password>
            <networks>
                <ip>127.0.0.1</ip>
                <ip>::1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </{name}>"""


def find_server_binary() -> Path:
    """The packaged clickhouse-server, or NotInstalledError naming the install script."""
    found = shutil.which("clickhouse-server")
    for candidate in ([found] if found else []) + list(_SERVER_CANDIDATES):
        if Path(candidate).is_file():
            return Path(candidate)
    raise NotInstalledError(f"clickhouse-server is not installed: {INSTALL_HINT}")


class ClickHouseServer(RestartableServer):
    """One clickhouse-server child process with its own config, data and log folder."""

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        mark_cache_mib: int = 64,
        uncompressed_cache_mib: int = 64,
        max_memory_mib: int = 2048,
        log_level: str = "information",
        start_timeout: float = 60.0,
        tls: CertAndKey | None = None,
        users: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        networks: Sequence[str] = (),
    ) -> None:
        """``tls``: also listen with TLS on ``secure_port`` with this certificate; ``users``: extra users
        (name -> password) besides ``default`` (no password), allowed from loopback; ``host``: the address to
        listen on (e.g. the node's, for pods of glasspipe_dev.cluster); ``networks``: more client networks
        (CIDRs, e.g. the pod subnet) the ``default`` user may connect from."""
        self.binary = find_server_binary()
        self._set_workdir(workdir, "gp-clickhouse-")
        self.data_dir = self.workdir / "data"
        self.log_dir = self.workdir / "log"
        self.config_path = self.workdir / "config.xml"
        self.users_path = self.workdir / "users.xml"
        self.tls = tls
        self.users = dict(users or {})
        self.host = host
        self.networks = list(networks)
        self.secure_port: int | None = None
        if tls is not None:
            self.port, self.http_port, self.secure_port = free_ports(3)
        else:
            self.port, self.http_port = free_ports(2)
        self.start_timeout = start_timeout
        self._settings = {
            "mark_cache_size": mark_cache_mib * _MiB,
            "uncompressed_cache_size": uncompressed_cache_mib * _MiB,
            "max_memory_usage": max_memory_mib * _MiB,
            "max_memory_usage_all": max_memory_mib * _MiB,
            "log_level": log_level,
        }
        self._process: ServerProcess | None = None
        self._version: tuple[int, ...] | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def _write_config(self) -> None:
        for d in (self.data_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            _CONFIG.format(
                tcp_port=self.port,
                http_port=self.http_port,
                data_dir=self.data_dir,
                log_dir=self.log_dir,
                users_xml=self.users_path,
                listen_host=self.host,
                secure=_SECURE.format(port=self.secure_port, cert=self.tls.cert, key=self.tls.key) if self.tls else "",
                **self._settings,
            )
        )
        extra = "".join(_USER.format(name=n, password=escape(p)) for n, p in sorted(self.users.items()))
        networks = "".join(f"\n                <ip>{escape(n)}</ip>" for n in [self.host, *self.networks])
        self.users_path.write_text(_USERS.format(extra_users=extra, extra_networks=networks, **self._settings))

    def start(self) -> ClickHouseServer:
        """Start (or start again after stop()/kill()) on the same ports and data; wait for SELECT 1."""
        if self.running():
            return self
        self._write_config()
        for port in (self.port, self.http_port, self.secure_port):
            if port is not None:
                self._wait_port_free(port)
        self._process = ServerProcess(
            "clickhouse-server",
            [str(self.binary), f"--config-file={self.config_path}"],
            self.log_dir / "stdout.log",
            cwd=self.workdir,
        ).start()
        self._process.wait_ready(self._ready, self.start_timeout, f"(tcp {self.port}, data {self.data_dir})")
        return self

    def _ready(self) -> bool:
        if not port_open(self.port, self.host):  # the driver logs every refused connection
            return False
        client = self.client(connect_timeout=1, send_receive_timeout=5)
        try:
            return bool(client.execute("SELECT 1") == [(1,)])
        finally:
            client.disconnect()

    # -- clients -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The native-protocol address in the form clickhouse-driver's Client.from_url accepts."""
        return f"clickhouse://{self.host}:{self.port}/default"

    def secure_client(self, ca_certs: str, database: str = "default", **kwargs: Any) -> Client:
        """A client over TLS on the secure native port, verifying the server against ``ca_certs``."""
        from clickhouse_driver import Client

        if self.secure_port is None:
            raise RuntimeError("this ClickHouseServer was started without tls")
        return Client(host=self.host, port=self.secure_port, database=database, secure=True, verify=True,
                      ca_certs=ca_certs, **kwargs)

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}/"

    def client(self, database: str = "default", **kwargs: Any) -> Client:
        """A clickhouse_driver.Client for this server (native protocol)."""
        from clickhouse_driver import Client

        return Client(host=self.host, port=self.port, database=database, **kwargs)

    def version(self) -> tuple[int, ...]:
        """The running server's version from SELECT version(), e.g. (18, 16, 1)."""
        if self._version is None:
            client = self.client()
            try:
                self._version = parse_version(str(client.execute("SELECT version()")[0][0]))
            finally:
                client.disconnect()
        return self._version

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_dir / "clickhouse-server.err.log", lines)
