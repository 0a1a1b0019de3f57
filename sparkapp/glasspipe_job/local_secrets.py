"""Secrets for a run outside Kubernetes (``glasspipe run --secrets-dir DIR``): the kubelet's part, locally.

``DIR/<secret name>/<key>`` holds one key of one Secret, the layout of a mounted Secret volume (and what
``kubectl create secret generic NAME --from-file=KEY=FILE`` reads). Env-var references are read into the
environment the job reads them from; file references are copied (mode 0600) under a private folder that
GLASSPIPE_SECRET_FILES_DIR points the job to (removed when the run ends). The same contract functions as
the render decide which Secret keys are needed, so a local run needs exactly what a pod would.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

from glasspipe import contract
from glasspipe.api import models
from glasspipe_job.failure import JobFailure


class LocalSecretMissing(JobFailure):
    """A Secret key the spec references is not in the --secrets-dir folder."""


def _read(directory: Path, secret: str, key: str, field: str) -> bytes:
    path = directory / secret / key
    try:
        return path.read_bytes()
    except OSError as e:
        raise LocalSecretMissing(f"{field} references key {key!r} of Secret {secret!r}, but {path} cannot be read "
                                 f"({e.strerror or e}): put the value in that file") from None


def load_local_secrets(spec: models.GlassPipelineSpec, directory: Path,
                       environ: MutableMapping[str, str] = os.environ) -> Path | None:
    """Set the env vars and lay out the files the spec's Secret references need; returns the files folder."""
    for e in contract.secret_env(spec):
        environ[e.var] = _read(directory, e.secret, e.key, e.field).decode().rstrip("\n")
    files = contract.secret_files(spec)
    if not files:
        return None
    root = Path(tempfile.mkdtemp(prefix="glasspipe-secrets-"))  # mode 0700
    atexit.register(shutil.rmtree, root, True)
    for f in files:
        target = Path(f.path_under(str(root)))
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        target.write_bytes(_read(directory, f.secret, f.key, f.field))
        target.chmod(0o600)
    environ[contract.ENV_SECRET_FILES_DIR] = str(root)
    return root
