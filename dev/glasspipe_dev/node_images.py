"""Images imported into the node's containerd, cached across clusters in $GLASSPIPE_CACHE/node-images.

`ctr images import` of the Spark image archive (847 MB) takes 125-150 s on the loaded 2-core machine,
most of it decompressing layers into overlayfs snapshots; every cluster used to pay it again. Here a
containerd root that holds exactly the wanted images is kept under a key made of containerd's version
and each archive's digest (the digest of its index.json, which names every layer's digest), and a new
cluster starts from a copy of it:

- the content blobs and the committed overlayfs snapshots are immutable, so they are hard links (the
  cache and the cluster share the same filesystem; a container's writes go to its own new upper dir);
- everything else (containerd's bolt databases above all, which are written in place) is a real copy.

An entry is made once, by the first cluster that needs it (import, stop containerd cleanly, copy, rename
into place), and the two newest entries are kept.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from glasspipe_dev.paths import cache_dir

KEEP = 2
# Immutable once written: hard-linked between the cache and a cluster.
_SHARED = ("io.containerd.content.v1.content/blobs", "io.containerd.snapshotter.v1.overlayfs/snapshots")


def archive_digest(archive: Path) -> str:
    """sha256 of the archive's index.json (OCI layout) or manifest.json (docker save)."""
    with tarfile.open(archive) as tar:
        for name in ("index.json", "manifest.json", "./index.json", "./manifest.json"):
            try:
                member = tar.getmember(name)
            except KeyError:
                continue
            f = tar.extractfile(member)
            if f is not None:
                return hashlib.sha256(f.read()).hexdigest()
    raise ValueError(f"{archive}: neither index.json nor manifest.json: not an image archive")


def cache_key(containerd: Path, archives: Sequence[Path]) -> str:
    version = subprocess.run([str(containerd), "--version"], capture_output=True, text=True, check=True).stdout
    h = hashlib.sha256(version.strip().encode())
    for a in archives:
        h.update(f"\n{a.name} {archive_digest(a)}".encode())
    return h.hexdigest()[:20]


def _root() -> Path:
    return cache_dir() / "node-images"


@contextmanager
def _locked() -> Iterator[None]:
    _root().mkdir(parents=True, exist_ok=True)
    with (_root() / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _copy_tree(src: Path, dst: Path) -> None:
    """``dst`` as a copy of containerd root ``src``: the immutable trees hard-linked, the rest copied."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", "--link", str(src), str(dst)], check=True)
    shared = [dst / s for s in _SHARED]
    for dirpath, dirnames, filenames in os.walk(dst):
        here = Path(dirpath)
        if any(here == s or s in here.parents for s in shared):
            dirnames.clear()
            continue
        for name in filenames:
            path = here / name
            if path.is_symlink() or not path.is_file():
                continue
            tmp = path.with_name(f".{name}.copy")
            shutil.copy2(path, tmp)
            os.replace(tmp, path)  # a file of its own instead of a link to src's


def restore(key: str, root: Path) -> list[list[str]] | None:
    """Make ``root`` (which must not exist) a copy of the cached containerd root ``key``; returns the image
    names of each archive, or None when the cache has no such entry."""
    entry = _root() / key
    with _locked():
        if not (entry / "names.json").is_file():
            return None
        _copy_tree(entry / "root", root)
        os.utime(entry)  # recently used: kept by the pruning
        return list(json.loads((entry / "names.json").read_text()))


def save(key: str, root: Path, names: list[list[str]]) -> None:
    """Keep a copy of ``root`` (containerd stopped) under ``key``; prune all but the newest entries."""
    entry = _root() / key
    with _locked():
        if (entry / "names.json").is_file():
            return
        tmp = _root() / f".{key}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _copy_tree(root, tmp / "root")
        (tmp / "names.json").write_text(json.dumps(names))
        shutil.rmtree(entry, ignore_errors=True)
        os.rename(tmp, entry)
        entries = sorted((p for p in _root().iterdir() if p.is_dir() and not p.name.startswith(".")),
                         key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[KEEP:]:
            shutil.rmtree(old, ignore_errors=True)
