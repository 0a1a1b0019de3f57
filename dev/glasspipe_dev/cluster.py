"""A real single-node Kubernetes cluster on this machine: the API server of kube.py plus
kube-controller-manager, kube-scheduler, containerd (runc, cgroupfs) and a kubelet with CNI bridge
networking. Pods really run; owner references really cascade through the garbage collector.

Why the node runs in its own mount namespace: the kubelet checks six kernel sysctls at start-up and
either rewrites them on the host (kernel.panic, vm.overcommit_memory, ...) or, with
``protectKernelDefaults``, refuses to start when they differ. We want neither, so a holder process
makes a private mount namespace in which those six /proc/sys files are bind-mounted read-only files
with the values the kubelet expects; containerd and the kubelet both run inside it (they must see
each other's mounts: volumes, rootfs). The host's sysctls and mount table are untouched, and every
mount the node made disappears with the namespace.

Everything lives under one temporary directory: containerd's root/state/socket, the kubelet's root,
pod logs, CNI config and IPAM state. Pods get their cgroups under a cgroup root of their own
(/glasspipe-<id>), so stopping the cluster can kill exactly the processes it started.
Binaries: dev/install/kube.sh (etcd, kube-apiserver, kubectl) and dev/install/kube-node.sh (the rest).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import yaml

from glasspipe_dev import node_images
from glasspipe_dev.kube import KubeAPIServer
from glasspipe_dev.paths import NotInstalledError, cache_dir
from glasspipe_dev.process import ServerProcess, free_port
from glasspipe_dev.reaper import (
    cgroup_pids,
    delete_bridge_at_exit,
    delete_link,
    empty_cgroups,
    forget_bridge,
    forget_folder,
    forget_node,
    kill_all,
    kill_node_at_exit,
    remove_folder,
    remove_folder_at_exit,
    shim_pids,
)

NODE_INSTALL_HINT = "run dev/install/kube-node.sh"
NODE_NAME = "glasspipe-node"
CLUSTER_CIDR = "10.244.0.0/16"  # every cluster's pod subnet lies in it (ClickHouse allows it, say)
# Each cluster takes a /24 of CLUSTER_CIDR and a bridge of its own (several clusters may run on one
# machine: two test sessions, say), held by a lock file for its lifetime. Index 0 (gpcni0, 10.244.0.0/24)
# is left alone: older versions of this module used it for every cluster.
POD_NETWORK_LOCKS = Path("/run/glasspipe-cni")
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
CNI_BIN_DIR = Path("/usr/lib/cni")
# The values kubelet's protectKernelDefaults requires (pkg/kubelet/cm/container_manager_linux.go).
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


def node_bin(name: str) -> Path:
    """A node binary: ours from the cache (kubelet & co.), the system's for containerd and runc."""
    path = cache_dir() / "bin" / name
    if path.is_file() and os.access(path, os.X_OK):
        return path
    found = shutil.which(name, path="/usr/bin:/usr/sbin:/bin:/sbin")
    if found:
        return Path(found)
    raise NotInstalledError(f"{name} is not installed: {NODE_INSTALL_HINT}")


def host_ip() -> str:
    """The address of the interface that carries the default route (the kubelet refuses loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("1.1.1.1", 9))  # UDP connect sends no packet: it only picks the outgoing interface
        return str(s.getsockname()[0])


class PodNetwork:
    """This cluster's CNI bridge and pod subnet: the first index from 1 whose lock is free and whose subnet the host
    does not route (a foreign network's is skipped). A bridge of that index with its lock free is a crashed
    cluster's whose reaper died too (a live cluster holds its lock for its lifetime): it is deleted and the index
    taken back."""

    def __init__(self) -> None:
        POD_NETWORK_LOCKS.mkdir(parents=True, exist_ok=True)
        for index in range(1, 255):
            lock_path = POD_NETWORK_LOCKS / f"{index}.lock"
            lock = lock_path.open("w")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            bridge, subnet = f"gpcni{index}", f"10.244.{index}.0/24"
            delete_link(bridge)
            routed = subprocess.run(["ip", "route", "show", subnet], capture_output=True, text=True).stdout.strip()
            if Path(f"/sys/class/net/{bridge}").exists() or routed:
                lock.close()
                continue
            self.index, self.bridge, self.subnet = index, bridge, subnet
            self.prefix = f"10.244.{index}."
            self._lock: IO[str] | None = lock
            delete_bridge_at_exit(bridge, lock_path)  # the CNI plugin makes it later
            return
        raise RuntimeError(f"no free pod network: every 10.244.N.0/24 (N 1-254) is taken ({POD_NETWORK_LOCKS})")

    def release(self) -> None:
        """Remove the bridge (the CNI plugin made it in the host's network namespace) and free the index."""
        if self._lock is None:
            return
        delete_link(self.bridge)
        self._lock.close()
        self._lock = None
        forget_bridge(self.bridge)


def pause_archive() -> Path:
    archives = sorted((cache_dir() / "images").glob("pause-*.oci.tar"))
    if not archives:
        raise NotInstalledError(f"no pause image archive in {cache_dir() / 'images'}: {NODE_INSTALL_HINT}")
    return archives[-1]


class Cluster:
    """API server (kube.py) + controller-manager + scheduler + containerd + kubelet, one node."""

    def __init__(self, base_dir: Path | None = None, keep_dir: bool = False, images: Sequence[Path] = ()) -> None:
        """``images``: image archives the node has before the kubelet starts (node_images caches them)."""
        self._own_dir = base_dir is None
        self.dir = Path(base_dir or tempfile.mkdtemp(prefix="glasspipe-cluster-"))
        self.keep_dir = keep_dir
        self.id = self.dir.name.replace("_", "-")
        self.cgroup_root = f"/{self.id}"
        bins = ["kube-controller-manager", "kube-scheduler", "kubelet", "containerd", "ctr", "runc"]
        self.bins = {b: node_bin(b) for b in bins}
        self.pause = pause_archive()
        self.images = [Path(a).resolve() for a in images]
        self.preloaded: dict[Path, list[str]] = {}  # archive -> its image names, in the node before start
        self.images_seconds = 0.0
        self.images_cached = False
        pki = self.dir / "api" / "pki"
        self.api = KubeAPIServer(
            base_dir=self.dir / "api",
            keep_dir=True,
            with_controller_manager=True,
            extra_args=(
                # kubectl logs/exec: the API server calls the kubelet with a system:masters client cert.
                f"--kubelet-client-certificate={pki / 'admin.crt'}",
                f"--kubelet-client-key={pki / 'admin.key'}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
            ),
        )
        self.sock = self.dir / "containerd" / "containerd.sock"
        self.holder: subprocess.Popen[bytes] | None = None
        self.net: PodNetwork | None = None
        self.procs: list[ServerProcess] = []
        self.startup_seconds = 0.0
        # Should this process die before stop(): its pods, their shims and cgroups, and the folder go with it.
        kill_node_at_exit(self.sock, self.cgroup_root)
        if self._own_dir and not keep_dir:
            remove_folder_at_exit(self.dir)

    @property
    def kubeconfig(self) -> Path:
        return self.api.kubeconfig

    def kubectl(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return self.api.kubectl(*args, **kw)  # type: ignore[arg-type]

    def start(self, timeout: float = 180.0) -> Cluster:
        t0 = time.monotonic()
        try:
            self.api.start()
            self._start_namespace()
            self._start_controller_manager(timeout)
            self._start_scheduler(timeout)
            self._start_containerd_with_images(timeout)
            self._start_kubelet()
            self._wait_node_ready(timeout)
            self._wait_default_service_account(timeout)
        except BaseException:
            self.keep_dir = True
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    # --- the node's mount namespace -------------------------------------------------------------

    def _start_namespace(self) -> None:
        d = self.dir / "sysctl"
        d.mkdir(parents=True, exist_ok=True)
        binds = []
        for key, value in KUBELET_SYSCTLS.items():
            f = d / key.replace("/", ".")
            f.write_text(value + "\n")
            binds.append(f"mount --bind -o ro {f} /proc/sys/{key}")
        script = " && ".join(["mount --make-rprivate /", *binds, "exec cat"])
        # The holder waits on a pipe from us: should this process die without stop(), the holder
        # (and with it the namespace) goes too.
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.holder.poll() is not None:
                raise RuntimeError(f"the node's mount namespace failed (unshare exited {self.holder.returncode})")
            try:
                # The holder execs cat only after its bind mounts are in place.
                if Path(f"/proc/{self.holder.pid}/cmdline").read_bytes().startswith(b"cat"):
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError("the node's mount namespace did not come up in 10 s")

    def _in_namespace(self, argv: list[str]) -> list[str]:
        assert self.holder is not None
        return ["nsenter", f"--mount=/proc/{self.holder.pid}/ns/mnt", "--", *argv]

    # --- control plane ---------------------------------------------------------------------------

    def _secure_ready(self, port: int) -> bool:
        ctx = self.api._ssl_context()
        ctx.check_hostname = False
        import ssl

        ctx.verify_mode = ssl.CERT_NONE  # self-signed serving certs of the component
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=3, context=ctx) as r:
            return r.status == 200

    def _start_controller_manager(self, timeout: float) -> None:
        pki = self.api.pki
        port = free_port()
        kc = str(self.api.kubeconfig)
        argv = [
            str(self.bins["kube-controller-manager"]),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.dir / 'controller-manager'}",
            # Token controller and root CA publisher, as on a real cluster.
            f"--service-account-private-key-file={pki['sa.key']}",
            f"--root-ca-file={pki['ca.crt']}",
            "--use-service-account-credentials=true",
            f"--cluster-cidr={CLUSTER_CIDR}",
            "--allocate-node-cidrs=false",
            "--leader-elect=false",
            "--profiling=false",
            "-v=1",
        ]
        p = ServerProcess(
            "kube-controller-manager", argv, self.dir / "kube-controller-manager.log", env={"GOMEMLIMIT": "512MiB"}
        ).start()
        self.procs.append(p)
        p.wait_ready(lambda: self._secure_ready(port), timeout, f"(https://127.0.0.1:{port}/healthz)")

    def _start_scheduler(self, timeout: float) -> None:
        port = free_port()
        kc = str(self.api.kubeconfig)
        argv = [
            str(self.bins["kube-scheduler"]),
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.dir / 'scheduler'}",
            "--leader-elect=false",
            "--profiling=false",
            "-v=1",
        ]
        p = ServerProcess("kube-scheduler", argv, self.dir / "kube-scheduler.log", env={"GOMEMLIMIT": "256MiB"}).start()
        self.procs.append(p)
        p.wait_ready(lambda: self._secure_ready(port), timeout, f"(https://127.0.0.1:{port}/healthz)")

    # --- node ------------------------------------------------------------------------------------

    def _write_cni(self) -> Path:
        if self.net is None:
            self.net = PodNetwork()
        conf_dir = self.dir / "cni" / "net.d"
        conf_dir.mkdir(parents=True, exist_ok=True)
        conf = {
            "cniVersion": "1.0.0",
            "name": "glasspipe",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.net.bridge,
                    "isGateway": True,
                    # No masquerading: pods talk to the node (the gateway) only, and no iptables
                    # rules are left behind on the host.
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.net.subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.dir / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (conf_dir / "10-glasspipe.conflist").write_text(json.dumps(conf, indent=2))
        return conf_dir

    def _start_containerd(self, timeout: float) -> None:
        d = self.dir / "containerd"
        d.mkdir(parents=True, exist_ok=True)
        cni_conf = self._write_cni()
        config = f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{self.sock}"
[ttrpc]
  address = "{d / "containerd.sock.ttrpc"}"
[debug]
  level = "warn"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  enable_selinux = false
  # The VM lacks CAP_SYS_RESOURCE: lowering oom_score_adj (pause: -998) fails in runc's nsexec
  # ("failed to update /proc/self/oom_score_adj: Permission denied"); clamp to containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{self.bins["runc"]}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf}"
"""
        (d / "config.toml").write_text(config)
        argv = self._in_namespace([str(self.bins["containerd"]), "--config", str(d / "config.toml")])
        p = ServerProcess("containerd", argv, self.dir / "containerd.log").start()
        self.procs.append(p)
        p.wait_ready(lambda: self.ctr("version").returncode == 0, timeout, f"({self.sock})")

    def _start_containerd_with_images(self, timeout: float) -> None:
        """containerd with the pause image and ``self.images``: from node_images' cache, or imported and
        then cached (containerd is stopped for the copy and started again)."""
        t0 = time.monotonic()
        archives = [self.pause, *self.images]
        key = node_images.cache_key(self.bins["containerd"], archives)
        names = node_images.restore(key, self.dir / "containerd" / "root")
        self.images_cached = names is not None
        self._start_containerd(timeout)
        if names is None:
            names = [self.import_image(a) for a in archives]
            self.procs.pop().stop()
            node_images.save(key, self.dir / "containerd" / "root", names)
            self._start_containerd(timeout)
        self.preloaded = {a: n for a, n in zip(archives, names, strict=True)}
        self.images_seconds = time.monotonic() - t0

    def ctr(self, *args: str, check: bool = False, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bins["ctr"]), "--address", str(self.sock), *args]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed ({res.returncode}): {res.stderr.strip()}")
        return res

    def import_image(self, archive: Path) -> list[str]:
        """Import an OCI (or docker) image archive into the CRI namespace; returns the image names."""
        res = self.ctr("-n", "k8s.io", "images", "import", "--all-platforms", str(archive), check=True)
        names = [line.split()[1] for line in res.stdout.splitlines() if line.startswith("unpacking ")]
        return names

    def _make_cgroup_root(self) -> None:
        """The kubelet checks that its cgroupRoot exists in every v1 controller; a new cpuset cgroup
        is unusable until it has CPUs and memory nodes, copied from the top."""
        for ctrl in Path("/sys/fs/cgroup").iterdir():
            if not ctrl.is_dir() or ctrl.name == "unified" or not (ctrl / "cgroup.procs").exists():
                continue
            base = ctrl / self.cgroup_root.lstrip("/")
            base.mkdir(exist_ok=True)
            if ctrl.name == "cpuset":
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (base / f).write_text((ctrl / f).read_text())

    def _start_kubelet(self) -> None:
        self._make_cgroup_root()
        self.node_ip = host_ip()
        d = self.dir / "kubelet"
        d.mkdir(parents=True, exist_ok=True)
        self.kubelet_port = free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # The API server reaches the kubelet (logs, exec) at the node's InternalIP, which may
            # not be a loopback address.
            "address": self.node_ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            # cgroup v1 (hybrid) on this VM: kubelets since 1.35 refuse it unless told otherwise.
            "failCgroupV1": False,
            "protectKernelDefaults": True,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "podLogsDir": str(self.dir / "pod-logs"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.api.pki["ca.crt"])},
            },
            "authorization": {"mode": "Webhook"},
            "clusterDomain": "cluster.local",
            "resolvConf": "/etc/resolv.conf",
            # A small shared CI disk must not make the kubelet evict pods or delete our imported
            # images (they cannot be pulled back).
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "maxPods": 30,
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "rotateCertificates": False,
            "localStorageCapacityIsolation": True,
        }
        (d / "config.yaml").write_text(yaml.safe_dump(config))
        argv = self._in_namespace(
            [
                str(self.bins["kubelet"]),
                f"--config={d / 'config.yaml'}",
                f"--kubeconfig={self.api.kubeconfig}",
                f"--root-dir={d / 'root'}",
                f"--cert-dir={d / 'pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={self.node_ip}",
                "-v=1",
            ]
        )
        self.procs.append(ServerProcess("kubelet", argv, self.dir / "kubelet.log").start())

    def _wait_node_ready(self, timeout: float) -> None:
        kubelet = self.procs[-1]

        def ready() -> bool:
            res = self.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
            if res.returncode != 0:
                return False
            conds = json.loads(res.stdout)["status"].get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

        kubelet.wait_ready(ready, timeout, f"(node {NODE_NAME} Ready)")

    def _wait_default_service_account(self, timeout: float) -> None:
        """Pods need the namespace's default ServiceAccount, made by the controller-manager."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0:
                return
            time.sleep(0.3)
        raise TimeoutError("the controller-manager made no default ServiceAccount")

    # --- teardown --------------------------------------------------------------------------------

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.name == "kubelet":
                p.stop()
        kill_all(cgroup_pids(self.cgroup_root) + shim_pids(str(self.sock)))
        for p in reversed(self.procs):
            p.stop()
        if self.holder is not None and self.holder.poll() is None:
            os.killpg(self.holder.pid, signal.SIGKILL)
            self.holder.wait(timeout=10)
        empty_cgroups(self.cgroup_root)
        forget_node(self.sock, self.cgroup_root)
        if self.net is not None:
            self.net.release()
        self.api.stop()
        if self._own_dir and not self.keep_dir:
            remove_folder(self.dir)
        else:
            forget_folder(self.dir)

    def logs(self) -> str:
        parts = [self.api.logs()] + [f"--- {p.name} ---\n{p.log_tail()}" for p in self.procs]
        return "\n".join(parts)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """`python -m glasspipe_dev.cluster`: start a cluster, print its kubeconfig, run until Ctrl-C."""
    cluster = Cluster(keep_dir=True).start()
    print(f"cluster up in {cluster.startup_seconds:.1f} s; KUBECONFIG={cluster.kubeconfig}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
