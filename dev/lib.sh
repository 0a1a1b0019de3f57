# Shared settings for the dev/ scripts. Source it; it sets paths only, it installs nothing.
# Everything downloaded or built lives under GLASSPIPE_CACHE so that a second run is fast and a
# fresh machine gets everything from the package registries.
set -euo pipefail
GP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export GP_ROOT
export GLASSPIPE_CACHE="${GLASSPIPE_CACHE:-$HOME/.cache/glasspipe}"
export GP_VENV="$GLASSPIPE_CACHE/venv"
export GP_BIN="$GLASSPIPE_CACHE/bin"
mkdir -p "$GLASSPIPE_CACHE" "$GP_BIN"
export PATH="$GP_VENV/bin:$GP_BIN:$PATH"
# Spark 4 and Kafka 4 need Java 17.
if [ -z "${JAVA_HOME:-}" ] && [ -d /usr/lib/jvm/java-17-openjdk-amd64 ]; then
  export JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64
fi

# One Go build environment for every Go build (kube-apiserver, the node commands, spark-operator, helm):
# module and build caches under the glasspipe cache, so one directory holds everything CI must keep.
gp_go_env() {
  export GOMODCACHE="$GLASSPIPE_CACHE/go/mod"
  export GOCACHE="$GLASSPIPE_CACHE/go/build"
  export GOFLAGS="-modcacherw -buildvcs=false"
  export GOTOOLCHAIN=local
  export CGO_ENABLED=0
}
# The Kubernetes commands the project runs, all built from the k8s.io/kubernetes wrapper module
# (dev/kube-apiserver-build; its go.mod pins the version). No kube-proxy: the dev node does not run it.
GP_KUBE_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet)

# Builds the named k8s.io/kubernetes commands missing from $GP_BIN in ONE `go build`, so the packages
# they share compile once and the two cores stay busy through the link steps; links $GP_BIN/<cmd>.
gp_build_kube_cmds() {
  local build_dir="$GP_ROOT/dev/kube-apiserver-build" version ver major minor ldflags="-s -w" pkg c out
  local missing=() pkgs=()
  version="$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$build_dir/go.mod")"
  for c in "$@"; do [ -x "$GP_BIN/$c-$version" ] || missing+=("$c"); done
  if [ "${#missing[@]}" = 0 ]; then
    gp_log "$* $version: cached"
  else
    command -v go >/dev/null 2>&1 || { gp_log "ERROR: the Go toolchain (go >= 1.26) is needed to build ${missing[*]}"; exit 1; }
    gp_go_env
    gp_log "${missing[*]} $version: building from k8s.io/kubernetes via the Go module proxy, one go build" \
      "(GOMODCACHE=$GOMODCACHE GOCACHE=$GOCACHE)"
    ver="${version#v}"
    major="${ver%%.*}"
    minor="${ver#*.}"
    minor="${minor%%.*}"
    # The same version stamps hack/lib/version.sh sets, so /version reports the real release.
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
      ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
      ldflags+=" -X $pkg.gitTreeState=clean"
    done
    for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
    out="$(mktemp -d "$GP_BIN/.kube-build.XXXXXX")"
    if ! (cd "$build_dir" && gp_timed go build -trimpath -ldflags="$ldflags" -o "$out/" "${pkgs[@]}"); then
      rm -rf "$out"
      exit 1
    fi
    for c in "${missing[@]}"; do mv "$out/$c" "$GP_BIN/$c-$version"; done
    rmdir "$out"
  fi
  for c in "$@"; do ln -sfn "$c-$version" "$GP_BIN/$c"; done
}
# Copies files of a Go module (fetched through the Go module proxy into GOMODCACHE) into OUT,
# atomically; a no-op once OUT is complete. Usage: gp_module_files MODULE@VERSION OUT GLOB...
gp_module_files() {
  local module="$1" out="$2" dir pattern
  shift 2
  if [ -f "$out/.complete" ]; then
    gp_log "$module: cached ($out)"
    return 0
  fi
  command -v go >/dev/null 2>&1 || { gp_log "ERROR: the Go toolchain is needed (go mod download $module)"; exit 1; }
  gp_go_env
  dir="$(cd /tmp && go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [ -n "$dir" ] || { gp_log "ERROR: go mod download of $module failed"; exit 1; }
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  # shellcheck disable=SC2086  # each pattern is a glob inside the module
  for pattern in "$@"; do cp "$dir"/$pattern "$out.tmp/"; done
  touch "$out.tmp/.complete"
  rm -rf "$out" && mv "$out.tmp" "$out"
  gp_log "$module: $out"
}

gp_log() { printf '[glasspipe-dev] %s\n' "$*" >&2; }

# Run "$@" and print how long it took, so set-up times are visible in CI logs.
gp_timed() {
  local start end
  start=$(date +%s)
  "$@"
  end=$(date +%s)
  gp_log "${*: -1} took $((end - start)) s"
}
