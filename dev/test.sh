#!/usr/bin/env bash
# The whole test suite: installs what is missing, checks the import contracts, then runs unit,
# integration and e2e tests against real local servers that the fixtures start and stop.
source "$(dirname "$0")/lib.sh"
cd "$GP_ROOT"
bash dev/setup.sh
start=$(date +%s)
# The import contracts in pyproject.toml ([tool.importlinter]) first: a broken one fails the run (set -e).
PYTHONPATH="$GP_ROOT/operator:$GP_ROOT/sparkapp:$GP_ROOT/dev" "$GP_VENV/bin/lint-imports" --no-cache
set +e
# Two workers (pytest-xdist): a Spark test keeps about one core busy, so two in parallel fill the
# two-core box. Tests marked xdist_group("node") share one worker and so one node cluster.
"$GP_VENV/bin/python" -m pytest -p no:cacheprovider -n "${GLASSPIPE_TEST_WORKERS:-2}" --dist loadgroup "$@"
rc=$?
set -e
gp_log "tests took $(( $(date +%s) - start )) s (exit $rc)"
exit $rc
