"""The real Kubeflow spark-operator controller as a local process against a Cluster (cluster.py).

Controller only: the mutating webhook is not run (glasspipe puts pod settings into pod templates,
which the controller passes to spark-submit). spark-operator runs `$SPARK_HOME/bin/spark-submit`
for each SparkApplication; SPARK_HOME is the pyspark in the venv, whose jars include
spark-kubernetes, so the submission client is the Spark the job uses. spark-submit finds the API
server the way spark-operator computes its master URL (KUBERNETES_SERVICE_HOST/PORT). Both run as
a ServiceAccount with a bearer token (KUBECONFIG), as in a real install: Spark's Kubernetes client
(fabric8) cannot read the admin kubeconfig's EC client key ("Invalid DER: object is not integer").
The ServiceAccount is bound to cluster-admin here, wider than the chart's RBAC.
Binary and CRDs: dev/install/spark-operator.sh.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pyspark

from glasspipe_dev.cluster import Cluster
from glasspipe_dev.kube import kube_bin
from glasspipe_dev.paths import NotInstalledError, cache_dir, java_home
from glasspipe_dev.process import ServerProcess, free_port

INSTALL_HINT = "run dev/install/spark-operator.sh"


def crd_dir() -> Path:
    found = sorted((cache_dir() / "kube").glob("spark-operator-crds-v*"))
    if not found:
        raise NotInstalledError(f"spark-operator CRDs missing under {cache_dir() / 'kube'}: "
                                "run dev/install/spark-operator-crd.sh")
    return found[-1]


class SparkOperator:
    """spark-operator's controller watching ``namespaces`` of ``cluster``."""

    def __init__(self, cluster: Cluster, namespaces: list[str], env: dict[str, str] | None = None) -> None:
        """``env``: extra environment of spark-operator (and so of its spark-submit)."""
        self.cluster = cluster
        self.namespaces = namespaces
        self.extra_env = dict(env or {})
        try:
            self.bin = kube_bin("spark-operator")
        except NotInstalledError as e:
            raise NotInstalledError(f"{e} ({INSTALL_HINT})") from e
        self.crds = crd_dir()
        self.spark_home = Path(pyspark.__file__).parent
        self.proc: ServerProcess | None = None

    def install_crds(self) -> None:
        for crd in sorted(self.crds.glob("*.yaml")):
            self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        for crd in sorted(self.crds.glob("*.yaml")):
            name = crd.stem.split("_", 1)[1] + "." + crd.stem.split("_", 1)[0]
            self.cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")

    def _kubeconfig(self) -> Path:
        ns, name = "kube-system", "spark-operator"
        self.cluster.kubectl("create", "serviceaccount", name, "-n", ns, check=False)
        self.cluster.kubectl(
            "create", "clusterrolebinding", name, "--clusterrole=cluster-admin",
            f"--serviceaccount={ns}:{name}", check=False,
        )  # fmt: skip
        return self.cluster.api.service_account_kubeconfig(ns, name, create=False)

    def start(self, timeout: float = 60.0) -> SparkOperator:
        self.install_crds()
        port = free_port()
        api = self.cluster.api
        argv = [
            str(self.bin),
            "controller",
            "start",
            f"--namespaces={','.join(self.namespaces)}",
            "--leader-election=false",
            # The UI service is a ClusterIP Service per application: not needed here.
            "--enable-ui-service=false",
            "--controller-threads=2",
            f"--health-probe-bind-address=127.0.0.1:{port}",
            "--metrics-bind-address=0",
            "--zap-log-level=info",
        ]
        env = {
            "KUBECONFIG": str(self._kubeconfig()),
            "SPARK_HOME": str(self.spark_home),
            "JAVA_HOME": java_home(),
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(api.port),
            "PATH": f"{java_home()}/bin:{os.environ.get('PATH', '')}",
            # spark-submit's JVM: small, it only creates the driver pod.
            "SPARK_SUBMIT_OPTS": "-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1",
        }
        self.proc = ServerProcess("spark-operator", argv, self.cluster.dir / "spark-operator.log", env=env)
        # spark-submit copies PYSPARK_PYTHON into the driver pod's environment unless the application sets
        # spark.pyspark.python: the tests' own interpreter (set by glasspipe_dev.spark for local sessions)
        # does not exist in the image ("Cannot run program …/venv/bin/python"). glasspipe's render sets it
        # (render.py); a hand-written application would rely on this.
        for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
            self.proc.env.pop(name, None)
        self.proc.env.update(self.extra_env)
        self.proc.start()

        def ready() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                return r.status == 200

        self.proc.wait_ready(ready, timeout, f"(http://127.0.0.1:{port}/readyz)")
        return self

    def logs(self) -> str:
        return self.proc.log_tail(80) if self.proc else "(not started)"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def __enter__(self) -> SparkOperator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
