#!/usr/bin/env bash
# Compiles glasspipe's JVM-side Spark operators (sparkapp/jvm, plain Java, no Maven) with javac
# against the pyspark wheel's own jars, into
#   $GLASSPIPE_CACHE/jvm-ops/<hash of sources + pyspark version>/glasspipe-spark-ops.jar
# and points $GLASSPIPE_CACHE/jvm-ops/current at it. Cached: a second run only re-hashes.
# Needs the venv (dev/install/python.sh) for pyspark/jars and a JDK 17 javac.
source "$(dirname "$0")/../lib.sh"

SRC_DIR="$GP_ROOT/sparkapp/jvm/src/main/java"
OUT_ROOT="$GLASSPIPE_CACHE/jvm-ops"

if [ ! -x "$GP_VENV/bin/python" ]; then
  gp_log "ERROR: no venv at $GP_VENV: run dev/install/python.sh first"
  exit 1
fi
read -r PYSPARK_VERSION SPARK_JARS < <("$GP_VENV/bin/python" -c \
  'import os, pyspark; print(pyspark.__version__, os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
if [ ! -f "$(ls "$SPARK_JARS"/spark-sql_2.13-*.jar 2>/dev/null | head -1)" ]; then
  gp_log "ERROR: no spark-sql jar in $SPARK_JARS (is pyspark installed in $GP_VENV?)"
  exit 1
fi
JAVAC="${JAVA_HOME:+$JAVA_HOME/bin/}javac"
if ! command -v "$JAVAC" >/dev/null 2>&1; then
  gp_log "ERROR: javac not found (install a JDK 17: apt-get install openjdk-17-jdk-headless)"
  exit 1
fi

mapfile -t SOURCES < <(cd "$SRC_DIR" && find . -name '*.java' | LC_ALL=C sort)
HASH="$( { echo "pyspark=$PYSPARK_VERSION"; cd "$SRC_DIR" && sha256sum "${SOURCES[@]}"; } | sha256sum | cut -c1-16)"
OUT_DIR="$OUT_ROOT/$HASH"
JAR="$OUT_DIR/glasspipe-spark-ops.jar"

if [ -f "$JAR" ]; then
  gp_log "jvm-ops: cached $JAR"
else
  gp_log "jvm-ops: compiling ${#SOURCES[@]} Java sources against pyspark $PYSPARK_VERSION jars"
  TMP="$(mktemp -d "$OUT_ROOT.tmp.XXXXXX")"
  trap 'rm -rf "$TMP"' EXIT
  mkdir -p "$TMP/classes"
  # -classfile: Arrow's class files name annotations (checker-framework's) that no jar here has; javac warns on
  # every class that touches Arrow's allocator, about those jars, not these sources.
  (cd "$SRC_DIR" && "$JAVAC" --release 17 -Xlint:all,-path,-serial,-classfile -Werror -encoding UTF-8 \
      -cp "$SPARK_JARS/*" -d "$TMP/classes" "${SOURCES[@]}")
  "${JAVA_HOME:+$JAVA_HOME/bin/}jar" --create --file "$TMP/glasspipe-spark-ops.jar" -C "$TMP/classes" .
  mkdir -p "$OUT_DIR"
  mv "$TMP/glasspipe-spark-ops.jar" "$JAR"
  gp_log "jvm-ops: built $JAR"
fi
ln -sfn "$HASH" "$OUT_ROOT/current"
echo "$JAR"
