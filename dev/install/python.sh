#!/usr/bin/env bash
# Creates the project's virtualenv (cached) and installs glasspipe with its Spark and dev extras.
source "$(dirname "$0")/../lib.sh"
if [ ! -x "$GP_VENV/bin/python" ]; then
  gp_log "creating virtualenv $GP_VENV"
  python3 -m venv "$GP_VENV"
  "$GP_VENV/bin/pip" install --quiet --upgrade pip
fi
"$GP_VENV/bin/pip" install --quiet -e "$GP_ROOT[spark,dev]"
"$GP_VENV/bin/python" -c "import pyspark, glasspipe; print('python ok: pyspark', pyspark.__version__)"
