#!/usr/bin/env bash
# Entry point of glasspipe's Spark image (sparkapp/Dockerfile), in the convention of Apache Spark's
# Kubernetes images, which spark-submit's Kubernetes backend and so spark-operator rely on:
#   driver ARGS...   the driver pod: spark-submit in client mode inside the pod; Spark passes
#                    `--properties-file /opt/spark/conf/spark.properties --class ... <main file> <args>`
#                    and the pod's IP in SPARK_DRIVER_BIND_ADDRESS
#   executor         an executor pod: KubernetesExecutorBackend, configured by the SPARK_* variables
#                    Spark sets on the pod (driver URL, id, cores, memory, pod name and IP, ...)
#   anything else    run as given (`spark-submit --master local[2] ...`, `python`, `bash`)
# tini is PID 1 so that signals reach the JVM and orphaned Python workers are reaped.
set -euo pipefail

: "${SPARK_HOME:=/opt/spark}"
conf_dir="${SPARK_CONF_DIR:-$SPARK_HOME/conf}"
classpath="$conf_dir:$SPARK_HOME/jars/*"
if [ -n "${HADOOP_CONF_DIR:-}" ]; then classpath="$HADOOP_CONF_DIR:$classpath"; fi
if [ -n "${SPARK_EXTRA_CLASSPATH:-}" ]; then classpath="$classpath:$SPARK_EXTRA_CLASSPATH"; fi
if [ -n "${SPARK_DIST_CLASSPATH:-}" ]; then classpath="$classpath:$SPARK_DIST_CLASSPATH"; fi

# The driver's class-data-sharing archive (sparkapp/Dockerfile, dev/images/dump-driver-cds.sh). The JVM maps it
# only with the classpath it was dumped with, whose conf folder is empty. Spark mounts spark.properties in the
# conf folder and names it with --properties-file, so when nothing else is there the driver takes the image's
# empty folder as SPARK_CONF_DIR and the archive. Any other file there (log4j2.properties, ...) or an extra
# classpath keeps Spark's usual classpath and starts without it (as would a mismatch: the JVM never fails on
# it). The driver's log says which, and why.
CDS_DIR=/opt/glasspipe/cds
driver_cds_obstacle() {   # prints why the driver cannot map the archive; nothing when it can
  if [ ! -f "$CDS_DIR/driver.jsa" ]; then echo "no $CDS_DIR/driver.jsa in the image"; return; fi
  if [ -n "${HADOOP_CONF_DIR:-}${YARN_CONF_DIR:-}${SPARK_EXTRA_CLASSPATH:-}${SPARK_DIST_CLASSPATH:-}" ]; then
    echo "HADOOP_CONF_DIR, YARN_CONF_DIR, SPARK_EXTRA_CLASSPATH or SPARK_DIST_CLASSPATH adds to the classpath"
    return
  fi
  local f
  for f in "$conf_dir"/* "$conf_dir"/.[!.]*; do   # a ConfigMap's ..data links do not count
    [ -e "$f" ] || [ -L "$f" ] || continue
    if [ "${f##*/}" != spark.properties ]; then echo "$f is on the classpath"; return; fi
  done
}

# The job's Python process: the child of the driver JVM whose command line names the job's main file.
job_python() {
  local pid stat rest
  for pid in /proc/[0-9]*; do
    pid="${pid#/proc/}"
    stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || continue
    rest="${stat##*) }"   # after "pid (comm) ": state ppid ...
    # shellcheck disable=SC2086  # split on purpose
    set -- $rest
    if [ "${2:-}" = "$JVM_PID" ] && grep -qa "glasspipe_job/main.py" "/proc/$pid/cmdline" 2>/dev/null; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}

case "${1:-}" in
  driver)
    shift
    obstacle="$(driver_cds_obstacle)"
    if [ -z "$obstacle" ]; then
      export SPARK_CONF_DIR="$CDS_DIR/conf"
      export SPARK_SUBMIT_OPTS="-XX:SharedArchiveFile=$CDS_DIR/driver.jsa${SPARK_SUBMIT_OPTS:+ $SPARK_SUBMIT_OPTS}"
      echo "glasspipe: the driver JVM maps the class-data-sharing archive $CDS_DIR/driver.jsa" >&2
    else
      echo "glasspipe: the driver JVM starts without the class-data-sharing archive: $obstacle" >&2
    fi
    exec /usr/bin/tini -s -- bash "$0" supervise-driver "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS:?is set by Spark on a driver pod}" \
      --deploy-mode client "$@"
    ;;
  supervise-driver)
    # SIGTERM (driver pod deleted, podman stop) goes to the job's Python, not the JVM: the job finishes
    # the micro-batch in flight, stops its query and exits, and the JVM follows. Sent to the JVM, Spark's
    # shutdown hook would stop the SparkContext under the running batch.
    shift
    "$@" &
    JVM_PID=$!
    on_term() {
      local target
      target="$(job_python)" || target="$JVM_PID"   # no job Python yet: the JVM has nothing to finish
      kill -TERM "$target" 2>/dev/null || true
    }
    trap on_term TERM INT
    while :; do
      rc=0
      wait "$JVM_PID" || rc=$?
      kill -0 "$JVM_PID" 2>/dev/null || break
    done
    exit "$rc"
    ;;
  executor)
    shift
    # SPARK_JAVA_OPT_0, _1, ...: the executor's JVM options, in their numeric order.
    java_opts=()
    while IFS= read -r name; do
      java_opts+=("${!name}")
    done < <(compgen -e | grep '^SPARK_JAVA_OPT_[0-9]*$' | sort -t_ -k4 -n)
    memory="${SPARK_EXECUTOR_MEMORY:?is set by Spark on an executor pod}"
    set -- "$JAVA_HOME/bin/java" "${java_opts[@]}" "-Xms$memory" "-Xmx$memory" -cp "$classpath" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL:?}" \
      --executor-id "${SPARK_EXECUTOR_ID:?}" \
      --cores "${SPARK_EXECUTOR_CORES:?}" \
      --app-id "${SPARK_APPLICATION_ID:?}" \
      --hostname "${SPARK_EXECUTOR_POD_IP:?}" \
      --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME:-}" \
      "$@"
    ;;
esac
exec /usr/bin/tini -s -- "$@"
