#!/usr/bin/env bash
# The main job: set up local Kafka and ClickHouse, produce SMS status events with duplicates,
# run examples/sms-dedup.yaml in local Spark, and print what landed in ClickHouse.
source "$(dirname "$0")/lib.sh"
cd "$GP_ROOT"
GLASSPIPE_SKIP_KUBE=1 bash dev/setup.sh
exec "$GP_VENV/bin/python" dev/demo.py "$@"
