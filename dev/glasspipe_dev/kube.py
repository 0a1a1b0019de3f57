"""A real, single-node Kubernetes API server (etcd + kube-apiserver) on loopback ports for tests.

There is no controller-manager, scheduler or kubelet: objects are stored, validated, watched and
authorized for real (RBAC), but nothing reconciles them. In particular there is no garbage collector
(owner references delete nothing) and no namespace controller (a deleted namespace stays Terminating),
so tests should use fresh namespaces and not wait for namespace deletion. Binaries come from
dev/install/kube.sh; certificates are made with the openssl CLI (no extra Python dependency).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from glasspipe_dev.paths import NotInstalledError, cache_dir
from glasspipe_dev.process import ServerProcess, free_port
from glasspipe_dev.reaper import remove_folder, temp_dir_at_exit

INSTALL_HINT = "run dev/install/kube.sh"
SERVICE_CIDR = "10.96.0.0/24"
ISSUER = "https://kubernetes.default.svc.cluster.local"


def kube_bin(name: str) -> Path:
    """Our own binary from the cache: /usr/bin/kubectl on dev machines may be something else entirely."""
    path = cache_dir() / "bin" / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise NotInstalledError(f"{name} is not installed at {path}: {INSTALL_HINT}")
    return path


def _openssl(*args: str) -> None:
    try:
        subprocess.run(["openssl", *args], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {e.stderr}") from e


def make_pki(directory: Path) -> dict[str, Path]:
    """CA, serving cert (127.0.0.1/localhost), admin client cert (O=system:masters), SA signing key.

    EC P-256 keys: as good as RSA for a test cluster and much faster to generate.
    """
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    p = {
        name: d / name
        for name in [
            "ca.crt", "ca.key", "server.crt", "server.key", "admin.crt", "admin.key", "sa.key", "sa.pub",
        ]
    }  # fmt: skip
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "3650"]
    _openssl("req", "-x509", *ec, "-keyout", str(p["ca.key"]), "-out", str(p["ca.crt"]),
             "-subj", "/CN=glasspipe-test-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    # OpenSSL 3 signs with -CA/-CAkey directly from `req -x509`.
    sans = (
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:10.96.0.1"
    )
    _openssl("req", "-x509", *ec, "-CA", str(p["ca.crt"]), "-CAkey", str(p["ca.key"]),
             "-keyout", str(p["server.key"]), "-out", str(p["server.crt"]),
             "-subj", "/CN=kube-apiserver",
             "-addext", "basicConstraints=critical,CA:FALSE",
             "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
             "-addext", "extendedKeyUsage=serverAuth", "-addext", sans)  # fmt: skip
    _openssl("req", "-x509", *ec, "-CA", str(p["ca.crt"]), "-CAkey", str(p["ca.key"]),
             "-keyout", str(p["admin.key"]), "-out", str(p["admin.crt"]),
             "-subj", "/O=system:masters/CN=glasspipe-admin",
             "-addext", "basicConstraints=critical,CA:FALSE",
             "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
             "-addext", "extendedKeyUsage=clientAuth")  # fmt: skip
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(p["sa.key"]))
    _openssl("pkey", "-in", str(p["sa.key"]), "-pubout", "-out", str(p["sa.pub"]))
    return p


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


class KubeAPIServer:
    """etcd + kube-apiserver with RBAC on 127.0.0.1, an admin kubeconfig and ServiceAccount kubeconfigs."""

    def __init__(
        self,
        base_dir: Path | None = None,
        keep_dir: bool = False,
        with_controller_manager: bool = False,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        """``with_controller_manager``: a kube-controller-manager will create ServiceAccounts and their
        tokens (dev/glasspipe_dev/cluster.py), so the ServiceAccount admission plugin stays on, as on
        a real cluster. ``extra_args`` are appended to kube-apiserver's command line."""
        self.with_controller_manager = with_controller_manager
        self.extra_args = extra_args
        self.etcd_bin = kube_bin("etcd")
        self.apiserver_bin = kube_bin("kube-apiserver")
        self.kubectl_bin = kube_bin("kubectl")
        self._own_dir = base_dir is None
        self.keep_dir = keep_dir
        if base_dir is not None:
            self.dir = Path(base_dir)
        elif keep_dir:
            self.dir = Path(tempfile.mkdtemp(prefix="glasspipe-kube-"))
        else:  # etcd's data and the logs (~130 MB): removed by stop(), or should this process die first
            self.dir = temp_dir_at_exit("glasspipe-kube-")
        self.pki: dict[str, Path] = {}
        self.port = 0
        self.etcd: ServerProcess | None = None
        self.apiserver: ServerProcess | None = None

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        """The admin (system:masters) kubeconfig."""
        return self.dir / "admin.kubeconfig"

    def start(self, timeout: float = 90.0) -> KubeAPIServer:
        try:
            self.pki = make_pki(self.dir / "pki")
            self._start_etcd(timeout)
            self._start_apiserver(timeout)
        except BaseException:
            self.keep_dir = True  # the logs explain the failure
            self.stop()
            raise
        return self

    def _start_etcd(self, timeout: float) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        argv = [
            str(self.etcd_bin),
            "--name=glasspipe",
            f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=glasspipe=http://127.0.0.1:{peer}",
            "--log-level=warn",
            # A throwaway store: durability only costs time here.
            "--unsafe-no-fsync=true",
            "--quota-backend-bytes=1073741824",
            "--snapshot-count=5000",
        ]
        self.etcd = ServerProcess("etcd", argv, self.dir / "etcd.log", env={"GOMEMLIMIT": "512MiB"}).start()

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as r:
                return bool(json.load(r).get("health") == "true")

        self.etcd.wait_ready(healthy, timeout, f"({self.etcd_url}/health)")

    def _start_apiserver(self, timeout: float) -> None:
        p = self.pki
        self.port = free_port()
        argv = [
            str(self.apiserver_bin),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--cert-dir={self.dir / 'certs'}",
            f"--tls-cert-file={p['server.crt']}",
            f"--tls-private-key-file={p['server.key']}",
            f"--client-ca-file={p['ca.crt']}",
            # Real RBAC, so the operator can be tested under its own ServiceAccount and Role(s).
            "--authorization-mode=RBAC",
            "--anonymous-auth=false",
            f"--service-account-issuer={ISSUER}",
            f"--service-account-key-file={p['sa.pub']}",
            f"--service-account-signing-key-file={p['sa.key']}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=false",
            "--profiling=false",
            "--event-ttl=30m",
            "-v=1",
        ]
        if not self.with_controller_manager:
            # No controller-manager: the ServiceAccount admission plugin would reject pods whose
            # ServiceAccount nobody created. Those tests create custom resources, not pods.
            argv.append("--disable-admission-plugins=ServiceAccount")
        argv.extend(self.extra_args)
        # GOMEMLIMIT keeps the heap (watch caches etc.) modest on a 2-core CI box.
        self.apiserver = ServerProcess(
            "kube-apiserver", argv, self.dir / "kube-apiserver.log", env={"GOMEMLIMIT": "1GiB"}
        ).start()
        self._write_admin_kubeconfig()
        self.apiserver.wait_ready(self._ready, timeout, f"({self.server}/readyz)")

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki["ca.crt"]))
        ctx.load_cert_chain(str(self.pki["admin.crt"]), str(self.pki["admin.key"]))
        return ctx

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.server}/readyz", timeout=3, context=self._ssl_context()) as r:
            return r.status == 200 and r.read().strip() == b"ok"

    def _kubeconfig_dict(self, user: str, creds: dict[str, str], namespace: str = "default") -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "glasspipe-test",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": _b64(self.pki["ca.crt"]),
                    },
                }
            ],
            "users": [{"name": user, "user": creds}],
            "contexts": [
                {"name": user, "context": {"cluster": "glasspipe-test", "user": user, "namespace": namespace}}
            ],
            "current-context": user,
        }

    def _write_admin_kubeconfig(self) -> None:
        creds = {
            "client-certificate-data": _b64(self.pki["admin.crt"]),
            "client-key-data": _b64(self.pki["admin.key"]),
        }
        self.kubeconfig.write_text(yaml.safe_dump(self._kubeconfig_dict("admin", creds)))

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run our kubectl (never the one on PATH) against this server; raises with stderr on failure."""
        argv = [str(self.kubectl_bin), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        res = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({res.returncode}): {res.stderr.strip()}")
        return res

    def service_account_kubeconfig(self, namespace: str, name: str, duration: str = "24h", create: bool = True) -> Path:
        """A kubeconfig that authenticates as ServiceAccount ``namespace/name`` with a bound token.

        The token comes from the TokenRequest API (`kubectl create token`), which the API server
        serves itself: no token controller or Secret needed. Permissions are whatever RBAC grants.
        """
        if create:
            sa = {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": name, "namespace": namespace},
            }
            self.kubectl("apply", "-f", "-", input=json.dumps(sa))
        token = self.kubectl("create", "token", name, "-n", namespace, f"--duration={duration}").stdout.strip()
        user = f"system:serviceaccount:{namespace}:{name}"
        path = self.dir / f"sa-{namespace}-{name}.kubeconfig"
        path.write_text(yaml.safe_dump(self._kubeconfig_dict(user, {"token": token}, namespace)))
        return path

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        """Environment for child processes (kopf, the operator CLI) that should talk to this server."""
        return {"KUBECONFIG": str(kubeconfig or self.kubeconfig)}

    def logs(self) -> str:
        parts = [f"--- {s.name} ---\n{s.log_tail()}" for s in (self.etcd, self.apiserver) if s is not None]
        return "\n".join(parts)

    def stop(self) -> None:
        for proc in (self.apiserver, self.etcd):
            if proc is not None:
                proc.stop()
        if self._own_dir and not self.keep_dir:
            remove_folder(self.dir)

    def __enter__(self) -> KubeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
