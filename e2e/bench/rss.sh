#!/usr/bin/env bash
# Measures the operator's resident memory idle and with N DynamoGraphDeployments of 3
# components each (replicas 0, so no pods: the operator still renders and caches 3 Deployments
# and a Service per graph). Runs against KUBECONFIG (e.g. `eval "$(make -s cluster-up)"`).
#
#   make cluster-up && eval "$(make -s cluster-up)" && bash e2e/bench/rss.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

N="${N:-500}"
NS="${NS:-rss-bench}"
BIN="${CARGO_TARGET_DIR:-target}/release/planner-operator"
[[ -n "${KUBECONFIG:-}" ]] || { echo "set KUBECONFIG (eval \"\$(make -s cluster-up)\")" >&2; exit 1; }
cargo build --release --locked -p planner-operator --bin planner-operator >&2

kubectl apply --server-side -f config/crd/ >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
kubectl delete namespace "$NS" --ignore-not-found --wait=true >/dev/null
kubectl create namespace "$NS" >/dev/null

"$BIN" run --namespace "$NS" --webhook-disabled --leader-election=false --metrics-addr 127.0.0.1:0 \
  --log-format json >/tmp/rss-bench-operator.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true' EXIT
sleep 5
rss() { awk '/VmRSS/ {print int($2/1024)}' "/proc/$pid/status"; }
idle=$(rss)

manifest=$(mktemp)
for i in $(seq 1 "$N"); do
  cat >>"$manifest" <<YAML
---
apiVersion: nvidia.com/v1beta1
kind: DynamoGraphDeployment
metadata: {name: graph-$i, namespace: $NS}
spec:
  components:
    - {name: frontend, type: frontend, replicas: 0, podTemplate: {spec: {containers: [{name: main, image: registry.invalid/frontend}]}}}
    - {name: prefill, type: prefill, replicas: 0, podTemplate: {spec: {containers: [{name: main, image: registry.invalid/worker, resources: {limits: {nvidia.com/gpu: 1}}}]}}}
    - {name: decode, type: decode, replicas: 0, podTemplate: {spec: {containers: [{name: main, image: registry.invalid/worker, resources: {limits: {nvidia.com/gpu: 1}}}]}}}
YAML
done
start=$SECONDS
kubectl apply --server-side -f "$manifest" >/dev/null
rm -f "$manifest"
# Wait until every graph has a status written by the operator.
while :; do
  done_count=$(kubectl -n "$NS" get dgd -o jsonpath='{range .items[*]}{.status.observedGeneration}{"\n"}{end}' | grep -c . || true)
  [[ "$done_count" -ge "$N" ]] && break
  (( SECONDS - start > 900 )) && { echo "timed out: $done_count of $N graphs reconciled" >&2; exit 1; }
  sleep 5
done
elapsed=$((SECONDS - start))
sleep 10
loaded=$(rss)
deployments=$(kubectl -n "$NS" get deployments --no-headers | wc -l)
echo "idle RSS: ${idle} MiB"
echo "RSS with $N DGDs ($deployments Deployments): ${loaded} MiB (all reconciled in ${elapsed}s)"
