"""Session fixture: one real single-node cluster (kubelet, containerd, controller-manager, scheduler).

Started only by the tests that ask for it (cold start ~25 s on the 2-core CI box), with the project's
images in the node's containerd before the kubelet starts: copied from $GLASSPIPE_CACHE/node-images when
a cluster has imported the same archives before (seconds), else imported (about 3 min) and cached.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from glasspipe_dev.cluster import Cluster
from glasspipe_dev.paths import NotInstalledError, cache_dir

PROJECT_IMAGES = ("glasspipe-operator", "glasspipe-spark")  # dev/install/images.sh


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """A started node cluster; fails (never skips) when dev/install/kube.sh or kube-node.sh is missing."""
    archives = [cache_dir() / "images" / f"{n}.oci.tar" for n in PROJECT_IMAGES]
    try:
        node = Cluster(images=[a for a in archives if a.is_file()])
    except NotInstalledError as e:
        pytest.fail(f"Kubernetes node not installed: {e}", pytrace=False)
    node.start()
    how = "copied from the node-images cache" if node.images_cached else "imported, now cached"
    print(f"\n[cluster] cold start-up {node.startup_seconds:.1f} s, of which images {node.images_seconds:.1f} s "
          f"({how}); {node.dir}")
    try:
        yield node
    finally:
        node.stop()


def import_project_image(cluster: Cluster, name: str) -> str:
    """Import $GLASSPIPE_CACHE/images/<name>.oci.tar (dev/install/images.sh) into the node."""
    archive = cache_dir() / "images" / f"{name}.oci.tar"
    if not archive.is_file():
        pytest.fail(f"image archive {archive} missing: run dev/install/images.sh", pytrace=False)
    if archive.resolve() in cluster.preloaded:
        return cluster.preloaded[archive.resolve()][0]
    t0 = time.monotonic()
    names = cluster.import_image(archive)
    print(f"\n[cluster] imported {names} in {time.monotonic() - t0:.1f} s")
    return names[0]
