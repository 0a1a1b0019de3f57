#!/usr/bin/env bash
# Dumps the class-data-sharing archive of a glasspipe Spark driver (dev/glasspipe_dev/spark_cds.py)
# into $GLASSPIPE_CACHE/spark-cds/: one real run of the sms-dedup example against a local Kafka and
# ClickHouse with -XX:ArchiveClassesAtExit. Later local Spark starts map the classes instead of
# loading them. Cached: keyed by the JVM, pyspark and the jars; a second run only checks the key.
# Needs the venv, Kafka, ClickHouse, the connector jars and the JVM operators jar (earlier steps).
source "$(dirname "$0")/../lib.sh"
cd "$GP_ROOT"
exec 9>"$GLASSPIPE_CACHE/.spark-cds.lock"
flock 9
PYTHONPATH="$GP_ROOT/operator:$GP_ROOT/sparkapp:$GP_ROOT/dev" "$GP_VENV/bin/python" -m glasspipe_dev.spark_cds
