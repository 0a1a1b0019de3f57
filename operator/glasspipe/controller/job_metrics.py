"""Read the Spark drivers' metrics endpoints: the only network I/O of the freshness observation.

A GET of each driver's ``/metrics`` (pod IP and the declared port) with a short timeout, straight to the
pod: never through an HTTP proxy from the environment (a proxy cannot reach pod IPs). A failure is the
replica's, not the reconciliation's: it comes back as a message for its status entry.
"""

from __future__ import annotations

import http.client
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from glasspipe.freshness import JobSample, Target, parse_job_metrics

TIMEOUT = 2.0  # seconds, connect and read: a reconciliation must not wait on a stuck driver
MAX_BYTES = 4 << 20  # the job's metrics are a few kB
MAX_PARALLEL = 8

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str, timeout: float = TIMEOUT) -> str:
    with _opener.open(url, timeout=timeout) as response:
        return str(response.read(MAX_BYTES).decode("utf-8", errors="replace"))


def read_sample(target: Target, timeout: float = TIMEOUT) -> tuple[JobSample | None, str]:
    """The driver's freshness sample, or None and why not (one line)."""
    if target.url is None:
        return None, target.problem
    try:
        return parse_job_metrics(fetch(target.url, timeout)), ""
    except (OSError, ValueError, http.client.HTTPException) as e:  # URLError, timeouts, refusals: OSError
        reason = getattr(e, "reason", None) or e
        return None, f"could not read {target.url}: {reason}"


def read_samples(targets: Sequence[Target], timeout: float = TIMEOUT) -> list[tuple[JobSample | None, str]]:
    """``read_sample`` of every target, in order; several at a time so that one stuck driver costs one
    timeout, not one per replica."""
    if len(targets) <= 1:
        return [read_sample(t, timeout) for t in targets]
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(targets))) as pool:
        return list(pool.map(lambda t: read_sample(t, timeout), targets))
