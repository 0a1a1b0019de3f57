#!/usr/bin/env bash
# Kubeflow spark-operator's own SparkApplication CRD (its structural schema prunes unknown fields, so a
# render that it would not keep is caught), from the spark-operator Go module via the Go module proxy.
# The tests apply this CRD instead of a hand-written one. Idempotent: skipped when cached.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

VERSION="${GP_SPARK_OPERATOR_VERSION:-v2.5.2}"  # the newest v2 the module proxy serves here
OUT="$GLASSPIPE_CACHE/kube/spark-operator-crds-$VERSION"
export GOMODCACHE="$GLASSPIPE_CACHE/go/mod" GOFLAGS="-modcacherw" GOTOOLCHAIN=local

if [ -f "$OUT/sparkoperator.k8s.io_sparkapplications.yaml" ]; then
  gp_log "spark-operator CRDs $VERSION: cached ($OUT)"
  exit 0
fi
command -v go >/dev/null 2>&1 || { gp_log "ERROR: the Go toolchain is needed (go mod download)"; exit 1; }
dir="$(cd /tmp && go mod download -json "github.com/kubeflow/spark-operator/v2@$VERSION" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -n "$dir" ] || { gp_log "ERROR: go mod download of spark-operator $VERSION failed"; exit 1; }
mkdir -p "$OUT.tmp"
cp "$dir/config/crd/bases/sparkoperator.k8s.io_sparkapplications.yaml" "$OUT.tmp/"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
gp_log "spark-operator CRDs $VERSION: $OUT"
