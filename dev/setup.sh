#!/usr/bin/env bash
# Installs everything glasspipe's demo and tests need, from the package registries, into
# $GLASSPIPE_CACHE (default ~/.cache/glasspipe). Idempotent: a second run takes seconds.
source "$(dirname "$0")/lib.sh"
start=$(date +%s)
cd "$GP_ROOT"
gp_timed bash dev/install/python.sh
gp_timed bash dev/install/clickhouse.sh
gp_timed bash dev/install/kafka.sh
gp_timed bash dev/install/spark-jars.sh
gp_timed bash dev/install/jvm-ops.sh
gp_timed bash dev/install/spark-cds.sh    # after Kafka, ClickHouse and the jars: a real run dumps it
if [ "${GLASSPIPE_SKIP_KUBE:-0}" != "1" ]; then
  gp_timed bash dev/install/kube.sh
  # After kube.sh: the node commands reuse its Go build cache (cold ~9.5 min at load ~10).
  gp_timed bash dev/install/kube-node.sh        # kubelet & co., containerd/runc/CNI, pause image
  gp_timed bash dev/install/spark-operator.sh   # the real spark-operator controller (cold ~7 min)
  gp_timed bash dev/install/monitoring-crds.sh
  gp_timed bash dev/install/spark-operator-crd.sh   # its CRDs, for the tests and the controller
fi
[ "${GLASSPIPE_SKIP_IMAGES:-0}" = "1" ] || gp_timed bash dev/install/images.sh  # podman: operator + Spark images
gp_log "set-up done in $(( $(date +%s) - start )) s"
