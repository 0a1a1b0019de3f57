#!/usr/bin/env bash
# Kubeflow spark-operator's own CRDs (SparkApplication, ScheduledSparkApplication, SparkConnect), from
# the spark-operator Go module via the Go module proxy. The tests apply its SparkApplication CRD instead
# of a hand-written one (its structural schema prunes unknown fields, so a render that spark-operator
# would not keep is caught), and the real controller (dev/install/spark-operator.sh) will not start
# without all three. Idempotent: skipped when cached.
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

SO_MODULE="github.com/kubeflow/spark-operator/v2"
# The version the controller build pins (dev/spark-operator-build/go.mod), so CRDs and controller match.
VERSION="$(awk -v m="$SO_MODULE" '$1 == "require" && $2 == m {print $3}' "$GP_ROOT/dev/spark-operator-build/go.mod")"
gp_module_files "$SO_MODULE@$VERSION" "$GLASSPIPE_CACHE/kube/spark-operator-crds-$VERSION" 'config/crd/bases/*.yaml'
