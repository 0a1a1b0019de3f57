#!/usr/bin/env bash
# podman with glasspipe's settings: storage under $GLASSPIPE_CACHE/containers (overlay driver), runc,
# cgroupfs and ulimits this VM can grant (see docs/images.md). dev/install/images.sh builds with it and
# tests/fixtures_images.py runs the images with it; use it to look around, e.g.
#   bash dev/images/podman.sh images
#   bash dev/images/podman.sh run --rm -it docker.io/glasspipe/spark:0.1.0 bash
set -euo pipefail
CT_DIR="${GLASSPIPE_CACHE:-$HOME/.cache/glasspipe}/containers"
mkdir -p "$CT_DIR"
# Why each line: podman's default ulimits try to raise limits past what an unprivileged VM may
# (rlimit "operation not permitted"), crun refuses cgroup v1 "hybrid" hosts, there is no systemd
# (so no systemd cgroup manager and no journald event log).
CONF='[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
'
if [ "$(cat "$CT_DIR/containers.conf" 2>/dev/null)" != "${CONF%$'\n'}" ]; then
  printf '%s' "$CONF" >"$CT_DIR/containers.conf.$$"
  mv "$CT_DIR/containers.conf.$$" "$CT_DIR/containers.conf"
fi
export CONTAINERS_CONF="$CT_DIR/containers.conf"
exec podman --root "$CT_DIR/storage" --runroot "$CT_DIR/run" --storage-driver overlay "$@"
