#!/usr/bin/env bash
# The whole test suite: installs what is missing, then runs unit, integration and e2e tests against
# real local servers that the fixtures start and stop.
source "$(dirname "$0")/lib.sh"
cd "$GP_ROOT"
bash dev/setup.sh
start=$(date +%s)
set +e
"$GP_VENV/bin/python" -m pytest -p no:cacheprovider "$@"
rc=$?
set -e
gp_log "tests took $(( $(date +%s) - start )) s (exit $rc)"
exit $rc
