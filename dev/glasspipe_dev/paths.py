"""Where the dev scripts cache downloads and builds (see dev/lib.sh, which must agree)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def cache_dir() -> Path:
    """The cache root: GLASSPIPE_CACHE, else ~/.cache/glasspipe."""
    return Path(os.environ.get("GLASSPIPE_CACHE", Path.home() / ".cache" / "glasspipe"))


def java_home() -> str:
    """Java 17 is what Kafka 4 and Spark 4 are tested with here."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    return "/usr/lib/jvm/java-17-openjdk-amd64"


def java_binary() -> Path:
    """``bin/java`` of java_home(), or NotInstalledError saying how to install it."""
    java = Path(java_home()) / "bin" / "java"
    if not java.is_file():
        raise NotInstalledError(f"no Java 17 at {java} (set JAVA_HOME or apt-get install openjdk-17-jdk-headless)")
    return java


class NotInstalledError(RuntimeError):
    """A component is missing from the cache: run the install script named in the message."""
