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
gp_log() { printf '[glasspipe-dev] %s\n' "$*" >&2; }

# Run "$@" and print how long it took, so set-up times are visible in CI logs.
gp_timed() {
  local start end
  start=$(date +%s)
  "$@"
  end=$(date +%s)
  gp_log "${*: -1} took $((end - start)) s"
}
