#!/usr/bin/env bash
# Installs the local Kubernetes toolkit into $GLASSPIPE_CACHE/bin, all from package registries:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet
#                   built in one go build from the k8s.io/kubernetes Go module (dev/kube-apiserver-build)
#   helm            go install helm.sh/helm/v3/cmd/helm
#   etcd, kubectl   Debian sid .debs, unpacked with dpkg-deb (never installed: no system service is
#                   created or started and no system apt configuration is touched)
# Idempotent: each piece is skipped when its versioned binary is already in the cache.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

HELM_VERSION="${GP_HELM_VERSION:-v3.22.0}"
# Versions we accept from Debian sid (it moves; we take its current package and check the series).
ETCD_SERIES="3.5."
KUBECTL_SERIES="1.36."

gp_go_env

need_go() {
  if ! command -v go >/dev/null 2>&1; then
    gp_log "ERROR: the Go toolchain (go >= 1.26) is needed to build helm"
    exit 1
  fi
}

build_helm() {
  local out="$GP_BIN/helm-$HELM_VERSION"
  if [ -x "$out" ]; then
    gp_log "helm $HELM_VERSION: cached ($out)"
  else
    need_go
    gp_log "helm $HELM_VERSION: go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    local gobin
    gobin="$(mktemp -d)"
    GOBIN="$gobin" gp_timed go install -trimpath -ldflags="-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    mv "$gobin/helm" "$out"
    rmdir "$gobin"
  fi
  ln -sfn "helm-$HELM_VERSION" "$GP_BIN/helm"
}

# apt with a private sources list, package lists, archive cache and an empty dpkg status, so that
# `apt-get download` sees only Debian sid and leaves /etc/apt and /var/lib/apt untouched.
SID_DIR="$GLASSPIPE_CACHE/apt-sid"
sid_apt() {
  local cmd="$1"
  shift
  "$cmd" -o APT::Sandbox::User=root -o Acquire::Languages=none \
    -o Dir::State::status="$SID_DIR/status" \
    -o Dir::Etc::SourceList="$SID_DIR/sid.sources" -o Dir::Etc::SourceParts="$SID_DIR/parts" \
    -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts="$SID_DIR/parts" \
    -o Dir::State::Lists="$SID_DIR/lists" -o Dir::Cache="$SID_DIR/cache" "$@"
}

sid_update() {
  [ -n "${SID_UPDATED:-}" ] && return 0
  mkdir -p "$SID_DIR/parts" "$SID_DIR/lists/partial" "$SID_DIR/cache/archives/partial" "$SID_DIR/debs"
  : >"$SID_DIR/status"
  cat >"$SID_DIR/sid.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: sid
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  gp_log "apt-get update (Debian sid lists only, private dir $SID_DIR)"
  sid_apt apt-get -qq update
  SID_UPDATED=1
}

# sid_binary PACKAGE SERIES BINARY...: unpack PACKAGE's current sid .deb and link its /usr/bin binaries.
sid_binary() {
  local pkg="$1" series="$2"
  shift 2
  local b missing=0
  for b in "$@"; do [ -x "$GP_BIN/$b" ] || missing=1; done
  if [ "$missing" = 0 ]; then
    gp_log "$pkg: cached ($(readlink "$GP_BIN/$1"))"
    return 0
  fi
  sid_update
  local ver
  # awk reads to the end: exiting early would SIGPIPE apt-cache and fail the pipeline (pipefail).
  ver="$(sid_apt apt-cache show "$pkg" | awk '$1 == "Version:" && !v {v = $2} END {print v}')"
  if [ -z "$ver" ]; then
    gp_log "ERROR: Debian sid has no package $pkg"
    exit 1
  fi
  case "${ver#*:}" in
    "$series"*) ;;
    *) gp_log "WARNING: Debian sid $pkg is $ver, expected $series*; using it anyway" ;;
  esac
  gp_log "$pkg: apt-get download $pkg=$ver + dpkg-deb -x"
  (cd "$SID_DIR/debs" && sid_apt apt-get -qq download "$pkg=$ver")
  local debs=("$SID_DIR/debs/${pkg}_"*.deb) dest="$GLASSPIPE_CACHE/kube/$pkg-${ver#*:}"
  local deb="${debs[0]}"
  rm -rf "$dest.tmp"
  mkdir -p "$dest.tmp"
  dpkg-deb -x "$deb" "$dest.tmp"
  rm -rf "$dest"
  mv "$dest.tmp" "$dest"
  rm -f "$deb"
  for b in "$@"; do
    ln -sfn "$dest/usr/bin/$b" "$GP_BIN/$b"
  done
}

main() {
  local start=$SECONDS
  # One install at a time: a second concurrent run waits, then finds everything cached.
  exec 9>"$GLASSPIPE_CACHE/.kube-install.lock"
  flock 9
  sid_binary etcd-server "$ETCD_SERIES" etcd
  sid_binary kubectl "$KUBECTL_SERIES" kubectl
  # kube-apiserver and the node commands (dev/install/kube-node.sh) in one build (cold ~15-20 min on 2 cores).
  gp_build_kube_cmds "${GP_KUBE_CMDS[@]}"
  build_helm
  gp_log "kube toolkit ready in $((SECONDS - start)) s:" \
    "$("$GP_BIN/kube-apiserver" --version)," \
    "etcd $("$GP_BIN/etcd" --version | awk 'NR==1 {print $3}')," \
    "kubectl $("$GP_BIN/kubectl" version --client -o json | awk -F'"' '/gitVersion/ {print $4}')," \
    "helm $("$GP_BIN/helm" version --short)"
}

main "$@"
