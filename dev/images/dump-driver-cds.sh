#!/usr/bin/env bash
# Run once by the Spark image's build (sparkapp/Dockerfile): dumps the class-data-sharing archive of a
# driver from CLASS_LIST, the classes a real local run loaded (dev/glasspipe_dev/spark_cds.py), against
# the JVM command spark-submit builds for a driver whose SPARK_CONF_DIR is CONF_DIR (empty). A JVM maps
# the archive only when its classpath starts as the dump's did and no directory on it holds files; the
# entrypoint (dev/images/spark-entrypoint.sh) hands the archive to such drivers only.
#   dump-driver-cds.sh CLASS_LIST ARCHIVE CONF_DIR
set -euo pipefail
list="${1:?usage: dump-driver-cds.sh CLASS_LIST ARCHIVE CONF_DIR}" archive="${2:?}" conf="${3:?}"
mkdir -p "$conf"
if [ -n "$(ls -A "$conf")" ]; then
  echo "ERROR: $conf must be empty: a directory with files on the classpath disables the archive" >&2
  exit 1
fi
# What bin/spark-class does: its environment (SPARK_SCALA_VERSION, ...), then the launcher prints the
# driver's java command, one NUL-terminated word each.
export SPARK_CONF_DIR="$conf"
set +u
# shellcheck source=/dev/null
source "$SPARK_HOME/bin/load-spark-env.sh"
set -u
mapfile -d '' words < <("$JAVA_HOME/bin/java" -Xmx128m -cp "$SPARK_HOME/jars/*" \
  org.apache.spark.launcher.Main org.apache.spark.deploy.SparkSubmit --version)
options=()
java_seen=0
for word in "${words[@]}"; do   # after the java binary (a "\0\n" comes first), up to the main class
  word="${word#$'\n'}"
  if [ "$java_seen" = 0 ]; then
    case "$word" in */bin/java) java_seen=1 ;; esac
    continue
  fi
  [ "$word" = org.apache.spark.deploy.SparkSubmit ] && break
  case "$word" in -Xmx*|-Xms*) ;; *) options+=("$word") ;; esac   # the heap size is the pod's
done
if [ "${options[0]:-}" != -cp ]; then
  echo "ERROR: unexpected launch command from Spark's launcher: ${words[*]}" >&2
  exit 1
fi
log="$(mktemp)"
if ! "$JAVA_HOME/bin/java" -Xshare:dump -XX:SharedClassListFile="$list" -XX:SharedArchiveFile="$archive" \
    "${options[@]}" >"$log" 2>&1; then
  tail -20 "$log" >&2
  exit 1
fi
rm -f "$log"
echo "driver CDS archive: $archive ($(( $(stat -c %s "$archive") >> 20 )) MiB, $(grep -vc '^[#@]' "$list") classes listed)," \
  "classpath ${options[1]}"
