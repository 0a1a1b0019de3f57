#!/usr/bin/env bash
# Fetches an Apache Kafka broker (KRaft) as plain jars from Maven Central into
#   $GLASSPIPE_CACHE/kafka/<version>/libs
# with a log4j2 backend and a WARN-level console log4j2.properties next to it. Tests run it with
# `java -cp 'libs/*' kafka.Kafka server.properties` (dev/glasspipe_dev/kafka.py).
#
# Why Maven and not the release tarball: the machine reaches only package registries; the tarball
# lives on downloads.apache.org. The kafka_2.13 POM has no logging backend, so log4j-core and
# log4j-slf4j2-impl are added; slf4j-api 2.x is pinned because kafka_2.13 itself asks for 1.7.36,
# which would not see the slf4j2 provider. Cached: a marker file makes a second run instant.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/maven.sh"

KAFKA_VERSION="${GP_KAFKA_VERSION:-4.3.1}"
LOG4J_VERSION="2.24.3"
SLF4J_VERSION="2.0.17"

DEST="$GLASSPIPE_CACHE/kafka/$KAFKA_VERSION"
MARKER="$DEST/.installed"
# Bump when the recipe below changes, so old caches are refreshed.
RECIPE="kafka=$KAFKA_VERSION log4j=$LOG4J_VERSION slf4j=$SLF4J_VERSION recipe=1"

if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$RECIPE" ] && [ -d "$DEST/libs" ]; then
  gp_log "kafka $KAFKA_VERSION: cached in $DEST"
else
  gp_log "kafka $KAFKA_VERSION: fetching org.apache.kafka:kafka_2.13 and log4j2 from Maven Central"
  WORK="$(mktemp -d "$GLASSPIPE_CACHE/kafka.tmp.XXXXXX")"
  trap 'rm -rf "$WORK"' EXIT
  gp_mvn_fetch "$WORK" \
    "org.apache.kafka:kafka_2.13:$KAFKA_VERSION" \
    "org.slf4j:slf4j-api:$SLF4J_VERSION" \
    "org.apache.logging.log4j:log4j-core:$LOG4J_VERSION" \
    "org.apache.logging.log4j:log4j-slf4j2-impl:$LOG4J_VERSION"
  if [ ! -f "$WORK/libs/kafka_2.13-$KAFKA_VERSION.jar" ]; then
    gp_log "ERROR: kafka_2.13-$KAFKA_VERSION.jar missing after mvn; see $WORK"
    trap - EXIT
    exit 1
  fi
  # Two slf4j-api versions on one classpath would make the binding a coin toss.
  if [ "$(find "$WORK/libs" -name 'slf4j-api-*.jar' | wc -l)" -ne 1 ]; then
    gp_log "ERROR: more than one slf4j-api jar resolved: $(ls "$WORK/libs"/slf4j-api-*.jar)"
    exit 1
  fi
  rm -rf "$DEST"
  mkdir -p "$DEST"
  mv "$WORK/libs" "$DEST/libs"
  mv "$WORK/deps.txt" "$DEST/"
  echo "$RECIPE" >"$MARKER"
  gp_log "kafka $KAFKA_VERSION: $(find "$DEST/libs" -name '*.jar' | wc -l) jars, $(du -sh "$DEST/libs" | cut -f1) in $DEST/libs"
fi
# The log config is written on every run, not cached with the jars, so a change to it reaches an existing cache.
cat >"$DEST/log4j2.properties" <<'EOF'
# Written by glasspipe dev/install/kafka.sh: test brokers log warnings and errors to the console
# (the KafkaServer helper sends the console to a log file).
status = warn
name = glasspipe-kafka
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
# Say once that the broker started: handy when reading a test's broker log.
logger.kafkaserver.name = kafka.server.KafkaRaftServer
logger.kafkaserver.level = INFO
# The controller's view of the broker: registrations, fencing and unfencing (a few lines a start, none per topic).
# A broker fenced by its own controller (a missed heartbeat on a busy machine) leads no partition until unfenced;
# a test's failure report then shows when.
logger.brokers.name = org.apache.kafka.controller.ClusterControlManager
logger.brokers.level = INFO
logger.heartbeats.name = org.apache.kafka.controller.BrokerHeartbeatManager
logger.heartbeats.level = INFO
EOF
echo "kafka ok: $DEST"
