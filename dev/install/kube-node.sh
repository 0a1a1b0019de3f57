#!/usr/bin/env bash
# Installs what a real single-node cluster needs next to kube-apiserver (dev/install/kube.sh):
#   kube-controller-manager, kube-scheduler, kubelet
#                   built together with kube-apiserver in one `go build` (gp_build_kube_cmds in
#                   dev/lib.sh, called by dev/install/kube.sh; a no-op here when they are cached)
#   containerd, runc, CNI plugins, iptables, conntrack
#                   Debian packages (apt-get; containerd's system service is not used: the cluster
#                   starts its own containerd with its own root, state and socket)
#   pause image     a static Go `pause` binary in a one-layer OCI archive made here, because the
#                   CRI sandbox image cannot be pulled (no registry is reachable)
# Idempotent: each piece is skipped when its versioned output is already in the cache. Tolerates
# another script (dev/install/images.sh) installing podman/runc through apt at the same time.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

PAUSE_VERSION="3.10-glasspipe"
PAUSE_REF="registry.k8s.io/pause:3.10"
PAUSE_DIR="$GLASSPIPE_CACHE/images"
PAUSE_TAR="$PAUSE_DIR/pause-$PAUSE_VERSION.oci.tar"
APT_PKGS=(containerd runc containernetworking-plugins iptables conntrack)

gp_go_env

install_debs() {
  local missing=() p
  for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ "${#missing[@]}" = 0 ]; then
    gp_log "Debian packages: cached (${APT_PKGS[*]})"
    return 0
  fi
  gp_log "apt-get install ${missing[*]}"
  local apt=(apt-get -y -q -o DPkg::Lock::Timeout=900)
  # --no-install-recommends: containerd needs nothing else here. A failure is retried once after an
  # update (stale lists), and the lock timeout waits for a concurrent apt-get in another script.
  if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" install --no-install-recommends "${missing[@]}"; then
    "${apt[@]}" update
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install --no-install-recommends "${missing[@]}"
  fi
  # The package starts a system containerd on /run/containerd; ours runs apart from it, and a
  # second containerd only costs memory on a 2-core CI machine: stop it when it is there.
  if pgrep -x containerd >/dev/null 2>&1 && [ -S /run/containerd/containerd.sock ] && command -v systemctl >/dev/null; then
    systemctl stop containerd 2>/dev/null || true
  fi
}


# A one-layer OCI image archive (oci-layout + index.json + blobs), the format `ctr images import`
# reads, holding a static pause binary: PID 1 of every pod sandbox, it only waits for a signal.
build_pause() {
  if [ -s "$PAUSE_TAR" ]; then
    gp_log "pause image: cached ($PAUSE_TAR)"
    return 0
  fi
  gp_log "pause image $PAUSE_REF: building $PAUSE_TAR"
  local work
  work="$(mktemp -d)"
  mkdir -p "$work/src" "$work/rootfs" "$work/oci/blobs/sha256"
  cat >"$work/src/go.mod" <<'EOF'
module glasspipe.dev/pause

go 1.22
EOF
  cat >"$work/src/main.go" <<'EOF'
// pause holds a pod's namespaces open: it waits for SIGINT/SIGTERM and reaps orphaned children.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
EOF
  (cd "$work/src" && go build -trimpath -ldflags="-s -w" -o "$work/rootfs/pause" .)
  local layer diff layer_sz config config_sz manifest manifest_sz
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/rootfs" -cf "$work/layer.tar" pause
  diff="$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
  gzip -n -9 "$work/layer.tar"
  layer="$(sha256sum "$work/layer.tar.gz" | cut -d' ' -f1)"
  layer_sz="$(stat -c %s "$work/layer.tar.gz")"
  mv "$work/layer.tar.gz" "$work/oci/blobs/sha256/$layer"
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$diff" >"$work/config.json"
  config="$(sha256sum "$work/config.json" | cut -d' ' -f1)"
  config_sz="$(stat -c %s "$work/config.json")"
  mv "$work/config.json" "$work/oci/blobs/sha256/$config"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config" "$config_sz" "$layer" "$layer_sz" >"$work/manifest.json"
  manifest="$(sha256sum "$work/manifest.json" | cut -d' ' -f1)"
  manifest_sz="$(stat -c %s "$work/manifest.json")"
  mv "$work/manifest.json" "$work/oci/blobs/sha256/$manifest"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest" "$manifest_sz" "$PAUSE_REF" "${PAUSE_REF##*:}" >"$work/oci/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$work/oci/oci-layout"
  mkdir -p "$PAUSE_DIR"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/oci" -cf "$PAUSE_TAR.tmp" .
  mv "$PAUSE_TAR.tmp" "$PAUSE_TAR"
  rm -rf "$work"
}

main() {
  local start=$SECONDS
  exec 9>"$GLASSPIPE_CACHE/.kube-node-install.lock"
  flock 9
  install_debs
  gp_build_kube_cmds "${GP_KUBE_CMDS[@]}"   # normally already built by dev/install/kube.sh
  build_pause
  gp_log "kube node ready in $((SECONDS - start)) s: $("$GP_BIN/kubelet" --version)," \
    "containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1 {print $3}')," \
    "pause $PAUSE_TAR"
}

main "$@"
