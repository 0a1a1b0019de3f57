#!/usr/bin/env bash
# End-to-end on a kind cluster: spark-operator's chart, Kafka, ClickHouse, the glasspipe chart and the
# two images built from this repository's Dockerfiles, examples/sms-dedup.yaml, and a check that every
# record lands in ClickHouse exactly once with duplicates removed.
#
# For a machine with Docker, kind, kubectl and helm, and access to the public image and chart
# registries. It cannot run in the project's CI machine (no Docker engine, no registry), so CI does not
# run it; the same path is covered there piecewise (tests/integration/test_chart.py, the image tests,
# e2e/test_full_path.py with a local stand-in for spark-operator).
#
# The Spark image takes the Kafka connector and JVM operators jars from the project's cache: run
# `GLASSPIPE_SKIP_KUBE=1 GLASSPIPE_SKIP_IMAGES=1 bash dev/setup.sh` once before.
#
#   bash e2e/kind/run.sh            # KEEP_CLUSTER=1 keeps the cluster afterwards
set -euo pipefail
cd "$(dirname "$0")/../.."
CLUSTER=${CLUSTER:-glasspipe-e2e}
UNIQUE=200   # distinct sms_id values; each is produced twice

kind create cluster --name "$CLUSTER" --wait 120s
[[ ${KEEP_CLUSTER:-0} == 1 ]] || trap 'kind delete cluster --name "$CLUSTER"' EXIT
kubectl config use-context "kind-$CLUSTER"

docker build -f operator/Dockerfile -t glasspipe/operator:0.1.0 .
bash dev/images/stage-jars.sh .   # the Kafka connector and JVM operators jars (docs/images.md)
docker build -f sparkapp/Dockerfile -t glasspipe/spark:0.1.0 .
kind load docker-image --name "$CLUSTER" glasspipe/operator:0.1.0 glasspipe/spark:0.1.0

# Checkpoints: a hostPath folder on the (single) kind node, shared by driver and executors.
docker exec "$CLUSTER-control-plane" mkdir -p -m 777 /var/glasspipe-checkpoints

helm repo add spark-operator https://kubeflow.github.io/spark-operator
helm repo update spark-operator
helm install spark-operator spark-operator/spark-operator -n spark-operator --create-namespace \
  --set "spark.jobNamespaces={default}" --set webhook.enable=false --wait
helm install glasspipe charts/glasspipe -n glasspipe-system --create-namespace --wait
helm test glasspipe -n glasspipe-system   # the chart's hook: the operator answers /healthz

kubectl apply -f e2e/kind/infra.yaml
kubectl -n kafka rollout status deploy/kafka --timeout=300s
kubectl -n clickhouse rollout status deploy/clickhouse --timeout=300s
for topic in sms-status sms-status-dlq; do
  kubectl -n kafka exec deploy/kafka -- /opt/kafka/bin/kafka-topics.sh --bootstrap-server localhost:9092 \
    --create --if-not-exists --topic "$topic" --partitions 2
done

# The example, with its checkpoint on the node's folder (Spark mounts it natively: no webhook needed).
vol=checkpoints
conf=""
for role in driver executor; do
  conf+="\"spark.kubernetes.$role.volumes.hostPath.$vol.mount.path\": \"/checkpoints\","
  conf+="\"spark.kubernetes.$role.volumes.hostPath.$vol.options.path\": \"/var/glasspipe-checkpoints\","
done
kubectl patch --local -f examples/sms-dedup.yaml --type merge -o yaml -p "{
  \"spec\": {\"checkpoint\": {\"location\": \"file:///checkpoints/sms-dedup\"},
            \"spark\": {\"conf\": {${conf%,}}}}}" | kubectl apply -f -

# Records keyed by sms_id (so each key's copies share a partition), every one sent twice.
now=$(date -u +%s)
for round in 1 2; do
  for i in $(seq 1 "$UNIQUE"); do
    ts=$(date -u -d "@$((now + i))" +%Y-%m-%dT%H:%M:%SZ)
    printf 'sms-%d\t{"sms_id":"sms-%d","status":"DELIVERED","phone":"+100000%d","meta":{"provider":"p%d"},"sent_at":"%s"}\n' \
      "$i" "$i" "$i" "$((i % 3))" "$ts"
  done
done | kubectl -n kafka exec -i deploy/kafka -- /opt/kafka/bin/kafka-console-producer.sh \
  --bootstrap-server localhost:9092 --topic sms-status --property parse.key=true --property key.separator=$'\t'

kubectl wait gp/sms-dedup --for=jsonpath='{.status.conditions[?(@.type=="Ready")].status}'=True --timeout=600s
kubectl get gp sms-dedup -o wide

query="SELECT count(), uniqExact(sms_id) FROM default.sms_status"
for _ in $(seq 1 120); do
  got=$(kubectl -n clickhouse exec deploy/clickhouse -- clickhouse-client -q "$query" 2>/dev/null || true)
  if [[ "$got" == "$UNIQUE"$'\t'"$UNIQUE" ]]; then
    echo "OK: $UNIQUE rows, one per sms_id, from $((2 * UNIQUE)) records"
    exit 0
  fi
  sleep 5
done
echo "FAILED: ClickHouse has (rows, distinct sms_id) = (${got:-none}), want ($UNIQUE, $UNIQUE)" >&2
kubectl get gp,sparkapplications,pods -A >&2
exit 1
