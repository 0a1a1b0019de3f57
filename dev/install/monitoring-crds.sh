#!/usr/bin/env bash
# The Prometheus Operator's ServiceMonitor and PodMonitor CRDs, so that the chart's optional monitors
# are validated by the real API server in tests/integration/test_chart.py. They come from the
# prometheus-operator Go module (its example/prometheus-operator-crd folder) via the Go module proxy.
# Idempotent: skipped when the versioned folder is in the cache.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

VERSION="${GP_PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
OUT="$GLASSPIPE_CACHE/kube/prometheus-operator-crds-$VERSION"
export GOMODCACHE="$GLASSPIPE_CACHE/go/mod" GOFLAGS="-modcacherw" GOTOOLCHAIN=local

if [ -f "$OUT/monitoring.coreos.com_podmonitors.yaml" ]; then
  gp_log "prometheus-operator CRDs $VERSION: cached ($OUT)"
  exit 0
fi
command -v go >/dev/null 2>&1 || { gp_log "ERROR: the Go toolchain is needed (go mod download)"; exit 1; }
dir="$(cd /tmp && go mod download -json "github.com/prometheus-operator/prometheus-operator@$VERSION" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -n "$dir" ] || { gp_log "ERROR: go mod download of prometheus-operator $VERSION failed"; exit 1; }
mkdir -p "$OUT.tmp"
cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
   "$dir/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml" "$OUT.tmp/"
rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
gp_log "prometheus-operator CRDs $VERSION: $OUT"
