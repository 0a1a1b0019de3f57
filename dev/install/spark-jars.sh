#!/usr/bin/env bash
# Fetches Spark's Kafka connector (org.apache.spark:spark-sql-kafka-0-10_2.13) at exactly the
# pyspark version installed in the venv, with its runtime dependencies, from Maven Central into
#   $GLASSPIPE_CACHE/spark-jars/<pyspark version>/*.jar
# Tests pass these with `spark.jars` (dev/glasspipe_dev/spark.py); no Ivy at run time.
#
# Jars whose artifact the pyspark wheel already ships in pyspark/jars are left out: two copies of a
# class on Spark's classpath (e.g. two jsr305 or slf4j versions) is a conflict waiting to happen, and
# the wheel's copy is the one Spark was built and tested with. Version mismatches are reported.
#
# Known gap on this machine's Maven Central: spark-token-provider-kafka-0-10_2.13 (a compile dependency of
# the connector) is missing for every 4.x release after 4.0.0. When the exact version does not resolve we
# substitute 4.0.0 (TOKEN_PROVIDER_FALLBACK) and say so loudly. Checked for 4.2.0 by a member-level link
# check of both jars against pyspark/jars: everything resolves except two LogKeys classes referenced by
# KafkaDelegationTokenProvider, which only runs to obtain Kafka delegation tokens (Kerberos), never in
# local mode or with SASL/PLAIN/SCRAM.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/maven.sh"

if [ ! -x "$GP_VENV/bin/python" ]; then
  gp_log "ERROR: no venv at $GP_VENV: run dev/install/python.sh first"
  exit 1
fi
read -r PYSPARK_VERSION PYSPARK_JARS < <("$GP_VENV/bin/python" -c \
  'import os, pyspark; print(pyspark.__version__, os.path.join(os.path.dirname(pyspark.__file__), "jars"))') || {
  gp_log "ERROR: pyspark is not importable from $GP_VENV: run dev/install/python.sh"
  exit 1
}
if [ ! -d "$PYSPARK_JARS" ]; then
  gp_log "ERROR: $PYSPARK_JARS missing (broken pyspark install?)"
  exit 1
fi

CONNECTOR="org.apache.spark:spark-sql-kafka-0-10_2.13:$PYSPARK_VERSION"
DEST="$GLASSPIPE_CACHE/spark-jars/$PYSPARK_VERSION"
MARKER="$DEST/.installed"
TOKEN_PROVIDER="org.apache.spark:spark-token-provider-kafka-0-10_2.13"
TOKEN_PROVIDER_FALLBACK="4.0.0"
RECIPE="connector=$CONNECTOR recipe=2"

if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$RECIPE" ]; then
  gp_log "spark-jars $PYSPARK_VERSION: cached in $DEST"
else
  gp_log "spark-jars: fetching $CONNECTOR and its runtime dependencies from Maven Central"
  WORK="$(mktemp -d "$GLASSPIPE_CACHE/spark-jars.tmp.XXXXXX")"
  trap 'rm -rf "$WORK"' EXIT
  if ! gp_mvn_fetch "$WORK" "$CONNECTOR" 2>&1 | tee "$WORK/mvn.log"; then
    if grep -q "spark-token-provider-kafka-0-10_2.13:jar:$PYSPARK_VERSION" "$WORK/mvn.log"; then
      gp_log "WARNING: $TOKEN_PROVIDER:$PYSPARK_VERSION is not on Maven Central;" \
        "using $TOKEN_PROVIDER:$TOKEN_PROVIDER_FALLBACK instead (see the comment at the top of $0)"
      gp_mvn_fetch "$WORK" "$CONNECTOR:${TOKEN_PROVIDER%%:*}/${TOKEN_PROVIDER##*:}" \
        "$TOKEN_PROVIDER:$TOKEN_PROVIDER_FALLBACK"
      echo "$TOKEN_PROVIDER:$TOKEN_PROVIDER_FALLBACK substituted for $PYSPARK_VERSION (not on Maven Central)" \
        >"$WORK/substituted.txt"
    else
      exit 1
    fi
  fi
  mkdir -p "$WORK/keep"
  : >"$WORK/kept.txt"
  : >"$WORK/shipped.txt"
  # deps.txt lines: groupId:artifactId:type[:classifier]:version:scope
  while IFS=: read -r g a t f4 f5 f6; do
    if [ -n "$f6" ]; then classifier="$f4"; version="$f5"; else classifier=""; version="$f4"; fi
    file="$a-$version${classifier:+-$classifier}.$t"
    if [ ! -f "$WORK/libs/$file" ]; then
      gp_log "ERROR: mvn listed $g:$a:$version but $file was not copied"
      exit 1
    fi
    # Same artifact in the wheel = a jar named <artifactId>-<digit>...; compare the versions.
    shipped="$(find "$PYSPARK_JARS" -maxdepth 1 -regextype posix-extended \
      -regex ".*/$(printf '%s' "$a" | sed 's/[.]/\\./g')-[0-9][^/]*\.jar" -printf '%f\n' | head -1)"
    if [ -n "$shipped" ]; then
      if [ "$shipped" = "$file" ]; then
        echo "$g:$a:$version (same version in pyspark/jars)" >>"$WORK/shipped.txt"
      else
        echo "$g:$a:$version (pyspark/jars has $shipped; the wheel's copy wins)" >>"$WORK/shipped.txt"
        gp_log "spark-jars: connector POM asks for $a $version, pyspark ships $shipped: using pyspark's"
      fi
    else
      mv "$WORK/libs/$file" "$WORK/keep/"
      echo "$g:$a:$version" >>"$WORK/kept.txt"
    fi
  done <"$WORK/deps.txt"
  if [ ! -f "$WORK/keep/spark-sql-kafka-0-10_2.13-$PYSPARK_VERSION.jar" ]; then
    gp_log "ERROR: the connector jar itself was not fetched; see $WORK"
    trap - EXIT
    exit 1
  fi
  rm -rf "$DEST"
  mkdir -p "$(dirname "$DEST")"
  mv "$WORK/keep" "$DEST"
  mv "$WORK/kept.txt" "$DEST/jars.txt"
  mv "$WORK/shipped.txt" "$DEST/left-out-shipped-by-pyspark.txt"
  if [ -f "$WORK/substituted.txt" ]; then mv "$WORK/substituted.txt" "$DEST/"; fi
  echo "$RECIPE" >"$MARKER"
  gp_log "spark-jars: kept $(wc -l <"$DEST/jars.txt") jars, left out $(wc -l <"$DEST/left-out-shipped-by-pyspark.txt") shipped by pyspark (see $DEST/left-out-shipped-by-pyspark.txt)"
fi
echo "spark-jars ok: $DEST"
