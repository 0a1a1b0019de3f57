#!/usr/bin/env bash
# Builds the real Kubeflow spark-operator (controller + webhook in one `spark-operator` command) from
# its published Go module github.com/kubeflow/spark-operator/v2 through a wrapper module
# (dev/spark-operator-build: the operator's go.mod pins k8s.io modules with replace directives,
# which `go install pkg@version` refuses). Its CRDs (all three: the controller
# will not start without them) come from dev/install/spark-operator-crd.sh; spark-submit comes from the pyspark in the venv (its jars
# include spark-kubernetes). Idempotent: skipped when the versioned binary is in the cache.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

BUILD_DIR="$GP_ROOT/dev/spark-operator-build"
SO_MODULE="github.com/kubeflow/spark-operator/v2"
SO_VERSION="$(awk -v m="$SO_MODULE" '$1 == "require" && $2 == m {print $3}' "$BUILD_DIR/go.mod")"
OUT="$GP_BIN/spark-operator-$SO_VERSION"

gp_go_env

exec 9>"$GLASSPIPE_CACHE/.spark-operator-install.lock"
flock 9
if [ -x "$OUT" ]; then
  gp_log "spark-operator $SO_VERSION: cached ($OUT)"
else
  command -v go >/dev/null || { gp_log "ERROR: the Go toolchain (go >= 1.24) is needed"; exit 1; }
  gp_log "spark-operator $SO_VERSION: building $SO_MODULE/cmd/operator via the Go module proxy"
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$SO_VERSION -X k8s.io/component-base/version.gitTreeState=clean"
  (cd "$BUILD_DIR" && gp_timed nice -n 19 go build -trimpath -ldflags="$ldflags" -o "$OUT.tmp" "$SO_MODULE/cmd/operator")
  mv "$OUT.tmp" "$OUT"
fi
ln -sfn "spark-operator-$SO_VERSION" "$GP_BIN/spark-operator"

gp_log "spark-operator $SO_VERSION: $("$GP_BIN/spark-operator" version --short 2>/dev/null | head -1 || true)"
