#!/usr/bin/env bash
# Copies the jars the Spark image needs from the project's cache into DIR/build/spark-jars/, the
# folder sparkapp/Dockerfile copies into SPARK_HOME/jars: Spark's Kafka connector with what it needs
# beyond the pyspark wheel (dev/install/spark-jars.sh) and glasspipe's JVM operators jar
# (dev/install/jvm-ops.sh). Both scripts run first: they take a second when cached, and so the staged
# jars always match the pyspark pin of pyproject.toml and the current Java sources.
#   bash dev/images/stage-jars.sh .     # then: docker build -f sparkapp/Dockerfile .
source "$(dirname "$0")/../lib.sh"
DIR="${1:?usage: stage-jars.sh DIR (the build context: the repository root or a staging folder)}"

PIN="$(sed -n 's/^ *"pyspark==\([^"]*\)".*/\1/p' "$GP_ROOT/pyproject.toml")"
if [ -z "$PIN" ]; then
  gp_log "ERROR: no \"pyspark==X\" pin in $GP_ROOT/pyproject.toml: the image needs an exact Spark version"
  exit 1
fi
bash "$GP_ROOT/dev/install/spark-jars.sh" >/dev/null
OPS_JAR="$(bash "$GP_ROOT/dev/install/jvm-ops.sh")"
# spark-jars.sh fetches for the venv's pyspark; jvm-ops.sh's jar hash includes that version too.
CONNECTOR_DIR="$GLASSPIPE_CACHE/spark-jars/$PIN"
if [ ! -f "$CONNECTOR_DIR/spark-sql-kafka-0-10_2.13-$PIN.jar" ]; then
  gp_log "ERROR: no Kafka connector jars for Spark $PIN in $CONNECTOR_DIR: the venv's pyspark is not" \
    "pyproject.toml's pin $PIN; run dev/install/python.sh"
  exit 1
fi
OUT="$DIR/build/spark-jars"
rm -rf "$OUT"
mkdir -p "$OUT"
cp "$CONNECTOR_DIR"/*.jar "$OPS_JAR" "$OUT/"
gp_log "staged $(find "$OUT" -name '*.jar' | wc -l) jars for Spark $PIN in $OUT"
