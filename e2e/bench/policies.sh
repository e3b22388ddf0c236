#!/usr/bin/env bash
# One operator process planning N PlannerPolicies (default 1,000): do they keep their
# adjustment intervals, and does the process stay under 200 MiB of resident memory?
# Runs against KUBECONFIG (e.g. `eval "$(make -s cluster-up)"`).
#
#   eval "$(make -s cluster-up)" && bash e2e/bench/policies.sh
#   N=200 INTERVAL=30 INTERVALS=3 bash e2e/bench/policies.sh      # a quicker run
#
# What runs, all on 127.0.0.1, on free ports in 39000-39999, from a temp dir of its own, and
# everything stopped on exit (the namespace is deleted too):
# - the synthetic Dynamo frontend (`planner-sim synthetic-frontend`) replaying the Azure
#   conversation trace (`crates/planner-core/tests/fixtures/traces/azure2023_conv.csv`, as the closed-loop e2e test
#   does) in real time with fixed workers (--prefill 2 --decode 4);
# - a real Prometheus (PROMETHEUS_BIN, else the one `make tools` builds or one on PATH) with N
#   static target groups, all pointing at
#   that frontend, each adding its own `dynamo_namespace: <namespace>-graph-<i>` (the label the
#   frontend PodMonitor adds in a cluster): every graph has its own full set of frontend series
#   (about 115 per graph, 115,000 for 1,000 graphs), nothing dropped by relabelling;
# - N DGDs `graph-<i>` with a prefill and a decode component (1 replica each) and N
#   PlannerPolicies, one per DGD, reading that Prometheus. No frontend component: the synthetic
#   frontend plays it (the operator's cost of rendering a frontend's Deployment and Service is
#   what `e2e/bench/rss.sh` measures);
# - the operator (release build) watching only that namespace, started before the objects so
#   that its idle memory can be read.
#
# Why these policies. `mode: sla` with the `kubernetes` connector, `minReplicas: 1`,
# `maxReplicas: 1`, the ARIMA predictor (the CRD default) and the built-in
# h200-llama3.1-8b-tp1 profile: every interval each policy runs its 14 Prometheus queries, feeds
# the predictors, computes the SLA plan, clamps it to the bounds, compares it with the DGD spec
# and writes its status, events and metrics, as in production. The bounds pin the decision to
# (1, 1), which is what each DGD already asks for, so the connector has nothing to patch, and a
# ResourceQuota of `pods: 0` in the namespace keeps the 2,000 worker pods from being created at
# all (their ReplicaSets report the quota; the DGDs stay not Ready, which the planner does not
# need). Pods would only load the API server and the 8 kwok nodes, not the planner; the
# operator's per-graph cost with rendered workloads is what `e2e/bench/rss.sh` measures.
# `observe` mode would skip the connector step entirely, and `load` mode reads other metrics.
# The queueing model's fast check runs between intervals (FAST_CHECK, default the CRD's 10s;
# `0s` turns it off); its snapshot queries are shared by every policy reading the same
# Prometheus.
#
# Measured: idle RSS (operator with the namespace empty), RSS with the N DGDs, peak (VmHWM) and
# steady (median of 2 s samples) RSS while every policy plans, over INTERVALS whole intervals
# after every policy has planned once: the operator's `planner_operator_interval_lateness_seconds`
# histogram (difference of two scrapes: bucket bounds of p50, p90, p99 and the highest
# non-empty bucket), intervals run against N x INTERVALS expected (a policy on schedule runs
# exactly INTERVALS times in a window of INTERVALS intervals), operator CPU, reconcile errors,
# intervals whose Prometheus queries failed (`planner_operator_metrics_unavailable_total`) and
# policies whose MetricsAvailable condition is False at the end.
#
# Pass criteria (exit 1 otherwise): peak RSS (VmHWM) < RSS_LIMIT_MIB (200); intervals run
# >= 99 % of expected; p99 lateness <= LATE_P99_MAX_S (default: a tenth of the interval) and no
# interval late by a whole interval or more; no Prometheus query failures and no reconcile errors
# of the PlannerPolicy controller during the window.
set -euo pipefail
cd "$(dirname "$0")/../.."

N="${N:-1000}"
NS="${NS:-ppol-bench}"
INTERVAL="${INTERVAL:-30}"                 # spec.adjustmentInterval, seconds
INTERVALS="${INTERVALS:-4}"                # intervals measured once every policy has planned
SCRAPE="${SCRAPE:-10}"                     # Prometheus scrape interval, seconds
PREDICTOR="${PREDICTOR:-arima}"
TRACE="${TRACE:-crates/planner-core/tests/fixtures/traces/azure2023_conv.csv}"
# Mooncake JSONL trace every policy warms its predictors up from (a ConfigMap); empty: none.
WARMUP="${WARMUP-../shared/data/traces/mooncake_conversation_trace.jsonl}"
RSS_LIMIT_MIB="${RSS_LIMIT_MIB:-200}"
LATE_P99_MAX_S="${LATE_P99_MAX_S:-$(awk -v i="$INTERVAL" 'BEGIN {print i / 10}')}"
START_TIMEOUT="${START_TIMEOUT:-600}"      # seconds for the DGDs and the first plans
KEEP_TMP="${KEEP_TMP:-}"                   # keep the temp dir (logs, Prometheus data)
BIN="${CARGO_TARGET_DIR:-target}/release/planner-operator"
SIM_BIN="${CARGO_TARGET_DIR:-target}/release/planner-sim"
MODEL=llama-3.1-8b
PROFILE=h200-llama3.1-8b-tp1

die() { echo "error: $*" >&2; exit 1; }
log() { echo "[$(date +%T)] $*" >&2; }
[[ -n "${KUBECONFIG:-}" ]] || die "set KUBECONFIG (eval \"\$(make -s cluster-up)\")"
for tool in kubectl curl jq; do
  command -v "$tool" >/dev/null || die "$tool not found"
done
# shellcheck source=../../tools/env.sh
source tools/env.sh
PROMETHEUS="$(prometheus_bin)" || die "no Prometheus: run \`make tools\` (it builds one) or set PROMETHEUS_BIN"
[[ -f "$TRACE" ]] || die "$TRACE is missing (shared/ must sit beside the repository, or set TRACE)"
[[ -z "$WARMUP" || -f "$WARMUP" ]] || die "$WARMUP is missing (set WARMUP, or WARMUP= for none)"
(( N >= 1 && INTERVAL >= 10 && INTERVALS >= 1 && SCRAPE >= 1 )) || die "need N >= 1, INTERVAL >= 10, INTERVALS >= 1, SCRAPE >= 1"

log "building $BIN"
CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}" cargo build --release --locked -p planner-operator --bin planner-operator -p planner-sim --bin planner-sim >&2

TMP=$(mktemp -d /tmp/ppol-bench.XXXXXX)
pids=()
cleanup() {
  local rc=$?
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  kubectl delete namespace "$NS" --wait=false >/dev/null 2>&1 || true
  if (( rc != 0 )); then
    for f in operator frontend prometheus; do
      [[ -s "$TMP/$f.log" ]] && { echo "--- end of $TMP/$f.log" >&2; tail -n 5 "$TMP/$f.log" >&2; }
    done
  fi
  if [[ -n "$KEEP_TMP" ]]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A free port in 39000-39999, in $REPLY (not a subshell, so that two calls never pick the same).
taken=" "
free_port() {
  local port
  for _ in $(seq 1 500); do
    port=$((39000 + RANDOM % 1000))
    [[ "$taken" == *" $port "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      taken+="$port "
      REPLY=$port
      return 0
    fi
  done
  die "no free port in 39000-39999"
}
wait_http() { # url seconds what
  local deadline=$((SECONDS + $2))
  until curl -fsS -o /dev/null "$1" 2>/dev/null; do
    (( SECONDS < deadline )) || die "$3 did not answer at $1 within $2 s"
    sleep 0.5
  done
}
promql() { # query -> first value, or empty
  curl -fsS --get "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$1" |
    jq -r '.data.result[0].value[1] // empty'
}
free_port; FE_PORT=$REPLY
free_port; PROM_PORT=$REPLY
free_port; OP_PORT=$REPLY

kubectl apply --server-side -f config/crd/ >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
kubectl delete namespace "$NS" --ignore-not-found --wait=true >/dev/null
kubectl create namespace "$NS" >/dev/null
kubectl -n "$NS" create quota no-pods --hard=pods=0 >/dev/null

log "synthetic frontend on 127.0.0.1:$FE_PORT"
"$SIM_BIN" synthetic-frontend --trace "$TRACE" --profile "$PROFILE" --model "$MODEL" \
  --prefill 2 --decode 4 --loop --listen "127.0.0.1:$FE_PORT" >"$TMP/frontend.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$FE_PORT/metrics" 60 "the synthetic frontend"

log "Prometheus on 127.0.0.1:$PROM_PORT: $N target groups, scrape every ${SCRAPE}s"
{
  printf 'global:\n  scrape_interval: %ss\n  scrape_timeout: %ss\n  evaluation_interval: %ss\n' \
    "$SCRAPE" "$(( SCRAPE < 10 ? SCRAPE : 10 ))" "$SCRAPE"
  printf 'scrape_configs:\n  - job_name: dynamo-frontend\n    honor_labels: true\n    static_configs:\n'
  for i in $(seq 1 "$N"); do
    printf '      - targets: ["127.0.0.1:%s"]\n        labels: {dynamo_namespace: "%s-graph-%s"}\n' \
      "$FE_PORT" "$NS" "$i"
  done
  # The decode engines' KV usage, which the synthetic frontend serves on /engine/metrics.
  printf '  - job_name: dynamo-worker\n    honor_labels: true\n    metrics_path: /engine/metrics\n    static_configs:\n'
  for i in $(seq 1 "$N"); do
    printf '      - targets: ["127.0.0.1:%s"]\n        labels: {dynamo_namespace: "%s-graph-%s", dynamo_component_type: decode}\n' \
      "$FE_PORT" "$NS" "$i"
  done
} >"$TMP/prometheus.yml"
"$PROMETHEUS" --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/prometheus-data" \
  --web.listen-address="127.0.0.1:$PROM_PORT" --log.level=warn >"$TMP/prometheus.log" 2>&1 &
prom_pid=$!
pids+=("$prom_pid")
wait_http "http://127.0.0.1:$PROM_PORT/-/ready" 120 "Prometheus"
prom_started=$SECONDS

log "operator (namespace $NS, metrics on 127.0.0.1:$OP_PORT)"
"$BIN" run --namespace "$NS" --webhook-disabled --leader-election=false \
  --metrics-addr "127.0.0.1:$OP_PORT" --prometheus-url "http://127.0.0.1:$PROM_PORT" \
  --log-format json >"$TMP/operator.log" 2>&1 &
op_pid=$!
pids+=("$op_pid")
wait_http "http://127.0.0.1:$OP_PORT/readyz" 60 "the operator"
sleep 5
status_kib() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$op_pid/status"; }
mib() { awk -v k="$1" 'BEGIN {printf "%.1f", k / 1024}'; }
idle_kib=$(status_kib VmRSS)
log "idle RSS $(mib "$idle_kib") MiB"

log "creating $N DGDs"
manifest="$TMP/dgds.yaml"
for i in $(seq 1 "$N"); do
  cat <<YAML
---
apiVersion: nvidia.com/v1beta1
kind: DynamoGraphDeployment
metadata: {name: graph-$i, namespace: $NS}
spec:
  components:
    - {name: prefill, type: prefill, replicas: 1, podTemplate: {spec: {containers: [{name: main, image: registry.invalid/worker, resources: {limits: {nvidia.com/gpu: 1}}}]}}}
    - {name: decode, type: decode, replicas: 1, podTemplate: {spec: {containers: [{name: main, image: registry.invalid/worker, resources: {limits: {nvidia.com/gpu: 1}}}]}}}
YAML
done >"$manifest"
# wait_all KIND FIELD WHAT: until every one of the N objects of KIND has FIELD in its status.
wait_all() {
  local done_count
  while :; do
    done_count=$(kubectl -n "$NS" get "$1" -o jsonpath="{range .items[*]}{.status.$2}{\"\\n\"}{end}" | grep -c . || true)
    (( done_count >= N )) && return 0
    (( SECONDS - start < START_TIMEOUT )) || die "timed out: $done_count of $N $3"
    sleep 2
  done
}
start=$SECONDS
kubectl apply --server-side -f "$manifest" >/dev/null
wait_all dgd observedGeneration "DGDs reconciled"
dgd_s=$((SECONDS - start))
dgd_kib=$(status_kib VmRSS)
log "$N DGDs reconciled in ${dgd_s}s; RSS $(mib "$dgd_kib") MiB"

# Every graph's series in Prometheus, and an interval of history, before the policies exist.
while :; do
  graphs=$(promql 'count(count by (dynamo_namespace) (dynamo_frontend_requests_total))')
  (( ${graphs:-0} >= N )) && break
  (( SECONDS - prom_started < START_TIMEOUT )) || die "Prometheus has series for ${graphs:-0} of $N graphs"
  sleep 2
done
while (( SECONDS - prom_started < INTERVAL + 2 * SCRAPE )); do sleep 1; done
series=$(promql 'count({__name__=~"dynamo_frontend_.*"})')
log "Prometheus has ${series} frontend series for $graphs graphs"

predictor="{type: $PREDICTOR}"
warmup_points=0
if [[ -n "$WARMUP" ]]; then
  # Only the fields the planner reads (the Mooncake hash_ids would not fit in a ConfigMap).
  jq -c '{timestamp, input_length, output_length}' "$WARMUP" >"$TMP/warmup.jsonl"
  kubectl -n "$NS" create configmap warmup-trace --from-file=trace.jsonl="$TMP/warmup.jsonl" >/dev/null
  predictor="{type: $PREDICTOR, warmupTrace: {configMapRef: {name: warmup-trace, key: trace.jsonl}}}"
  warmup_points=$(jq -s --argjson i "$INTERVAL" 'map(.timestamp / 1000 / $i | floor) | unique | length' "$TMP/warmup.jsonl")
fi
log "creating $N PlannerPolicies (mode sla, interval ${INTERVAL}s, predictor $PREDICTOR, $warmup_points intervals of warm-up)"
manifest="$TMP/policies.yaml"
for i in $(seq 1 "$N"); do
  cat <<YAML
---
apiVersion: planner.dynamo.io/v1alpha1
kind: PlannerPolicy
metadata: {name: graph-$i, namespace: $NS}
spec:
  targetRef: {name: graph-$i}
  mode: sla
  adjustmentInterval: ${INTERVAL}s
  sla: {ttftMs: 500, itlMs: 50}
  bounds: {minReplicas: 1, maxReplicas: 1, maxGpuBudget: 2}
  predictor: $predictor
  behavior: {fastCheckPeriod: ${FAST_CHECK:-10s}}
  profile: {builtin: $PROFILE}
  metrics: {prometheus: {url: "http://127.0.0.1:$PROM_PORT"}, modelName: $MODEL}
  connector: {type: kubernetes}
YAML
done >"$manifest"
start=$SECONDS
kubectl apply --server-side -f "$manifest" >/dev/null
wait_all ppol lastTickTime "policies planned once"
first_s=$((SECONDS - start))
log "every policy planned once ${first_s}s after creation; measuring $INTERVALS intervals"

# Operator metrics: value of a series (summed over label sets matching a regex), or 0.
scrape() { curl -fsS "http://127.0.0.1:$OP_PORT/metrics"; }
metric() { # file name-regex
  awk -v re="$2" '$1 ~ "^(" re ")$" {s += $2; f = 1} END {printf "%.0f\n", f ? s : 0}' "$1"
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
tck=$(getconf CLK_TCK)
scrape >"$TMP/metrics.before"
# Prometheus's own count of the queries it answered (instant and range).
prom_queries() { curl -fsS "http://127.0.0.1:$PROM_PORT/metrics" |
  awk '$1 ~ /^prometheus_http_requests_total\{.*handler="\/api\/v1\/query(_range)?"/ {s += $2} END {printf "%.0f\n", s}'; }
queries_before=$(prom_queries)
cpu_before=$(cpu_ticks "$op_pid")
prom_cpu_before=$(cpu_ticks "$prom_pid")
window_start=$SECONDS
window=$((INTERVALS * INTERVAL))
: >"$TMP/rss.samples"
while (( SECONDS - window_start < window )); do
  status_kib VmRSS >>"$TMP/rss.samples"
  sleep 2
done
scrape >"$TMP/metrics.after"
queries_after=$(prom_queries)
cpu_after=$(cpu_ticks "$op_pid")
prom_cpu_after=$(cpu_ticks "$prom_pid")
window_s=$((SECONDS - window_start))
status_kib VmRSS >>"$TMP/rss.samples"
hwm_kib=$(status_kib VmHWM)
steady_kib=$(sort -n "$TMP/rss.samples" | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
last_kib=$(tail -n 1 "$TMP/rss.samples")
prom_rss_kib=$(awk '$1 == "VmRSS:" {print $2}' "/proc/$prom_pid/status")

# Lateness: bucket counts of the window (after minus before), cumulative by `le`.
lateness() { grep '^planner_operator_interval_lateness_seconds_bucket' "$1" |
  sed -E 's/.*le="([^"]+)".* ([0-9.e+]+)$/\1 \2/'; }
LC_ALL=C join <(lateness "$TMP/metrics.before" | LC_ALL=C sort) <(lateness "$TMP/metrics.after" | LC_ALL=C sort) |
  awk '{le = ($1 == "+Inf") ? 1e308 : $1; print le, $1, $3 - $2}' | sort -g >"$TMP/lateness"
ran=$(awk 'END {print $3 + 0}' "$TMP/lateness")
expected=$((N * INTERVALS))
quantile() { # q -> the upper bound of the bucket that holds it
  awk -v q="$1" -v n="$ran" '$3 >= q * n && n > 0 {print $2; exit} END {if (n == 0) print "-"}' "$TMP/lateness"
}
p50=$(quantile 0.5); p90=$(quantile 0.9); p99=$(quantile 0.99); pmax=$(quantile 1)
late_sum=$(awk '/^planner_operator_interval_lateness_seconds_sum/ {print $2}' "$TMP/metrics.after")
late_sum0=$(awk '/^planner_operator_interval_lateness_seconds_sum/ {print $2}' "$TMP/metrics.before")
late_mean=$(awk -v a="$late_sum" -v b="$late_sum0" -v n="$ran" 'BEGIN {printf "%.3f", n ? (a - b) / n : 0}')
delta() { echo $(( $(metric "$TMP/metrics.after" "$1") - $(metric "$TMP/metrics.before" "$1") )); }
errors=$(delta 'planner_operator_reconcile_errors_total\{controller="plannerpolicy".*')
unavailable=$(delta 'planner_operator_metrics_unavailable_total.*')
# Which reasons, when there were any (the counter is labelled by reason).
unavailable_reasons=$(awk '
  $1 ~ /^planner_operator_metrics_unavailable_total/ && match($1, /reason="[^"]*"/) {
    r = substr($1, RSTART + 8, RLENGTH - 9)
    if (FILENAME ~ /after$/) a[r] += $2; else b[r] += $2
  }
  END { for (r in a) if (a[r] - b[r] > 0) printf "%s %d; ", r, a[r] - b[r] }' \
  "$TMP/metrics.before" "$TMP/metrics.after")
reconciles=$(delta 'planner_operator_reconcile_total\{controller="plannerpolicy".*')
policy_series=$(grep -c '^planner_operator_[a-z_]*{namespace="'"$NS"'"' "$TMP/metrics.after" || true)
unavailable_now=$(kubectl -n "$NS" get ppol \
  -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="MetricsAvailable")].status}{"\n"}{end}' |
  grep -c False || true)
# Policies that saw the trace's requests and made a decision in their last interval.
observing=$(kubectl -n "$NS" get ppol \
  -o jsonpath='{range .items[*]}{.status.observed.requests} {.status.desired.prefill}{"\n"}{end}' |
  awk '$1 > 0 && $2 != "" {n++} END {print n + 0}')
example=$(kubectl -n "$NS" get ppol graph-1 -o jsonpath='{.status.message}')
cpu_pct=$(awk -v a="$cpu_before" -v b="$cpu_after" -v t="$tck" -v w="$window_s" 'BEGIN {printf "%.1f", (b - a) / t / w * 100}')
prom_cpu_pct=$(awk -v a="$prom_cpu_before" -v b="$prom_cpu_after" -v t="$tck" -v w="$window_s" 'BEGIN {printf "%.1f", (b - a) / t / w * 100}')

echo
echo "lateness of the $ran intervals in the window (bucket upper bound: intervals at or under it):"
awk '{printf "  le %-6s %d\n", $2, $3}' "$TMP/lateness"
echo
echo "| What | Measured |"
echo "|---|---|"
echo "| Policies / DGDs | $N / $N (interval ${INTERVAL} s, mode sla, predictor $PREDICTOR warmed up with $warmup_points intervals, Prometheus scrape ${SCRAPE} s) |"
echo "| Prometheus series | ${series} frontend series, $graphs graphs; Prometheus RSS $(mib "$prom_rss_kib") MiB, CPU ${prom_cpu_pct} % |"
echo "| RSS idle | $(mib "$idle_kib") MiB |"
echo "| RSS with $N DGDs, no policies | $(mib "$dgd_kib") MiB (DGDs reconciled in ${dgd_s} s) |"
echo "| RSS while planning: peak (VmHWM) / steady (median) / end | $(mib "$hwm_kib") / $(mib "$steady_kib") / $(mib "$last_kib") MiB |"
echo "| Every policy planned once | ${first_s} s after creation |"
echo "| Intervals run in ${window_s} s | $ran of $expected expected ($reconciles reconciles) |"
echo "| Lateness p50 / p90 / p99 / max (bucket bounds) | <= ${p50} / <= ${p90} / <= ${p99} / <= ${pmax} s (mean ${late_mean} s) |"
echo "| Operator CPU | ${cpu_pct} % of one core |"
echo "| Prometheus queries | $((queries_after - queries_before)) in ${window_s} s ($(awk -v q=$((queries_after - queries_before)) -v w="$window_s" 'BEGIN {printf "%.1f", q / w}') per second; fast check every ${FAST_CHECK:-10s}) |"
echo "| Prometheus query failures / reconcile errors | $unavailable intervals${unavailable_reasons:+ (${unavailable_reasons%; })} / $errors (MetricsAvailable=False at the end: $unavailable_now) |"
echo "| Operator series of the policies | $policy_series |"
echo "| Policies that observed requests and decided, at the end | $observing of $N |"
echo
echo "graph-1's last interval: $example"

fail=()
(( hwm_kib < RSS_LIMIT_MIB * 1024 )) || fail+=("peak RSS $(mib "$hwm_kib") MiB >= $RSS_LIMIT_MIB MiB")
(( ran * 100 >= expected * 99 )) || fail+=("only $ran of $expected intervals ran")
awk -v p="$p99" -v m="$LATE_P99_MAX_S" 'BEGIN {exit !(p != "-" && p != "+Inf" && p + 0 <= m + 0)}' ||
  fail+=("p99 lateness <= $p99 s exceeds $LATE_P99_MAX_S s")
awk -v p="$pmax" -v i="$INTERVAL" 'BEGIN {exit !(p != "+Inf" && p + 0 < i + 0)}' ||
  fail+=("an interval ran <= $pmax s late (interval ${INTERVAL} s)")
(( unavailable == 0 )) || fail+=("$unavailable intervals could not read Prometheus")
(( errors == 0 )) || fail+=("$errors reconcile errors")
(( observing == N )) || fail+=("only $observing of $N policies observed requests and decided")
if (( ${#fail[@]} )); then
  printf 'FAIL: %s\n' "${fail[@]}" >&2
  exit 1
fi
echo
echo "PASS: peak RSS < $RSS_LIMIT_MIB MiB, >= 99 % of intervals ran, p99 lateness <= $LATE_P99_MAX_S s, no query failures"
