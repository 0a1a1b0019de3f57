#!/usr/bin/env bash
# The Prometheus Operator's ServiceMonitor and PodMonitor CRDs, so that the chart's optional monitors
# are validated by the real API server in tests/integration/test_chart.py. They come from the
# prometheus-operator Go module (its example/prometheus-operator-crd folder) via the Go module proxy.
# Idempotent: skipped when the versioned folder is in the cache.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

VERSION="${GP_PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
gp_module_files "github.com/prometheus-operator/prometheus-operator@$VERSION" \
  "$GLASSPIPE_CACHE/kube/prometheus-operator-crds-$VERSION" \
  example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml \
  example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml
