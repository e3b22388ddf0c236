#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# `make demo`: the planner closed loop on this machine, in a few minutes. Brings up the local
# control plane (fake GPU nodes played by kwok) unless KUBECONFIG names a cluster, installs the
# CRDs and the chart's RBAC (rendered with `helm template`, namespace-scoped), builds and runs the
# operator on the host with a token of the chart's ServiceAccount, creates the sample
# ClusterTopologyBinding (Grove's CRD, from ../shared/upstream/grove/), the demo DGD and a
# PlannerPolicy that plans every 10 s (config/demo/), and starts the test bed (`planner-sim
# dynamo-bed`): NVIDIA Dynamo's real frontend for the frontend pod and a real mocker engine for
# each Ready prefill and decode pod (installed by `make dynamo`), a load generator replaying a
# generated trace (1 -> 8 -> 1 requests/s of long prompts over 5.5 min, looped) against the
# frontend, and a real Prometheus scraping them as the chart's dynamoPodMonitors would (what a
# cluster without NVIDIA's Dynamo operator installs). Then it prints one line per planner
# interval: what the planner observed, predicted and decided, and the engine processes running.
# Runs until Ctrl-C, or for DEMO_SECONDS; then stops everything it started, removes what it
# created, and prints what the Dynamo processes cost (CPU, memory).
#
# Environment (all optional):
#   KUBECONFIG                 use this cluster instead of starting one. It must be a test cluster
#                              whose nodes are fake (kwok): the DGD's pods ask for nvidia.com/gpu
#                              and vLLM images. The demo creates DEMO_NAMESPACE, applies the CRDs,
#                              the ClusterTopologyBinding `gpu-cluster` and a ClusterRole(Binding), and
#                              deletes what it created on exit (the CRDs stay).
#   PLANNER_CLUSTER_DIR        state of the cluster the demo starts (default: its own,
#                              .../planner-operator-demo-cluster-<uid>, apart from `make cluster-up`'s)
#   PLANNER_CLUSTER_PORT_BASE  ports of that cluster, base+1..base+5 (default 17440)
#   DEMO_SECONDS               stop after this many seconds of planning (default: run until Ctrl-C)
#   DEMO_EXPECT_SCALING=1      exit non-zero unless the replicas went up and then down again with at
#                              least three engine processes at the peak; stops as soon as they have
#                              (DEMO_SECONDS is then the time limit; 330 s covers one cycle of the
#                              trace)
#   DEMO_NAMESPACE             namespace of the DGD and the policy (planner-demo)
#   DEMO_PROMETHEUS_PORT, DEMO_BED_PORT, DEMO_METRICS_PORT
#                              loopback ports of Prometheus (19090), the test bed's status and load
#                              control (19000) and the operator's /metrics (19080); the Dynamo
#                              frontend takes a free port, the engines free ports in
#                              DEMO_ENGINE_PORTS (30000-32767: Dynamo wants them below 32768)
#   PROMETHEUS                 the prometheus binary (default: PROMETHEUS_BIN, else `prometheus` on
#                              PATH, else the one `make tools` builds; see prometheus_bin in env.sh)
#   PYTHON                     the Python `make dynamo` builds Dynamo's virtual environment with
#                              (python3; >= 3.10 with venv), on the first run
#   CARGO                      cargo (default: cargo)
set -euo pipefail
cd "$(dirname "$0")"

# The demo's own cluster: a state directory and ports apart from `make cluster-up` (16440) and CI
# (26440), so it runs beside them.
export PLANNER_CLUSTER_DIR="${PLANNER_CLUSTER_DIR:-${XDG_RUNTIME_DIR:-${TMPDIR:-/tmp}}/planner-operator-demo-cluster-$(id -u)}"
export PLANNER_CLUSTER_PORT_BASE="${PLANNER_CLUSTER_PORT_BASE:-17440}"
source ./env.sh
source ./procs.sh

REPO="$(cd .. && pwd)"
NS="${DEMO_NAMESPACE:-planner-demo}"
PROM_PORT="${DEMO_PROMETHEUS_PORT:-19090}"
BED_PORT="${DEMO_BED_PORT:-19000}"
ENGINE_PORTS="${DEMO_ENGINE_PORTS:-30000-32767}"
METRICS_PORT="${DEMO_METRICS_PORT:-19080}"
DEMO_SECONDS="${DEMO_SECONDS:-}"
EXPECT_SCALING="${DEMO_EXPECT_SCALING:-}"
DGD=llama-disagg
POLICY=llama-demo
MODEL_NAME=llama-3.1-8b        # config/demo/: the served model and the profile the engines are timed by
PROFILE=h200-llama3.1-8b-tp1
RELEASE=planner-demo
SA="$RELEASE-planner-operator" # the chart's fullname for this release
INTERVAL_S=10                  # config/demo/plannerpolicy-demo.yaml
FIELD_MANAGER=planner-operator-demo

[[ -z "$DEMO_SECONDS" || "$DEMO_SECONDS" =~ ^[0-9]+$ ]] || fail "DEMO_SECONDS must be a number of seconds, not '$DEMO_SECONDS'"
[[ "$NS" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || fail "DEMO_NAMESPACE '$NS' is not a valid namespace name"

stamp() { printf '[%4ds]' "$SECONDS"; }
step() { printf '%s %s\n' "$(stamp)" "$*" >&2; }

# --- Requirements, before anything is started ------------------------------------------------
for cmd in curl awk; do
  command -v "$cmd" >/dev/null 2>&1 || fail "$cmd not found on PATH: the demo needs it"
done
for entry in "Prometheus:$PROM_PORT:DEMO_PROMETHEUS_PORT" "the test bed:$BED_PORT:DEMO_BED_PORT" \
  "the operator's metrics:$METRICS_PORT:DEMO_METRICS_PORT"; do
  IFS=: read -r what port var <<<"$entry"
  port_in_use "$port" && fail "port $port on 127.0.0.1 (for $what) is in use: stop what holds it or set $var"
done

# kubectl and helm: the ones `make tools` builds; with KUBECONFIG set, ones on PATH do too.
# Prometheus: an installed one, else the one `make tools` builds (prometheus_bin, env.sh).
PROMETHEUS="${PROMETHEUS:-$(prometheus_bin || true)}"
if { [[ -z "${KUBECONFIG:-}" || ! -f "$TOOLS_DIR/.complete" ]] &&
  ! { [[ -n "${KUBECONFIG:-}" ]] && command -v kubectl >/dev/null && command -v helm >/dev/null; }; } ||
  [[ -z "$PROMETHEUS" ]]; then
  step "building the local control plane's tools and Prometheus (make tools; a no-op once cached)"
  bash ./build.sh
  PROMETHEUS="${PROMETHEUS:-$(prometheus_bin || true)}"
fi
[[ -n "$PROMETHEUS" && -f "$PROMETHEUS" && -x "$PROMETHEUS" ]] ||
  fail "prometheus not found: the demo runs a real Prometheus, which \`make tools\` builds (or set PROMETHEUS=/path/to/prometheus)"
# Dynamo's frontend and engines: the virtual environment `make dynamo` installs (a no-op once
# cached).
if [[ ! -f "$DYNAMO_DIR/.complete" ]]; then
  step "installing NVIDIA Dynamo $DYNAMO_VERSION's frontend and engines (make dynamo; a no-op once cached)"
fi
bash ./dynamo-venv.sh
DYNAMO_PY="$(dynamo_python)"
DYNAMO_MODEL="$(dynamo_model_dir)"
if [[ -f "$TOOLS_DIR/.complete" ]]; then
  KUBECTL="$TOOLS_BIN/kubectl"
  HELM="$TOOLS_BIN/helm"
else
  KUBECTL="$(command -v kubectl)"
  HELM="$(command -v helm)"
fi
k() { "$KUBECTL" "$@"; }

# --- Cleanup: everything this run started or created, whatever the way out -------------------
DEMO_DIR="$(mktemp -d "${TMPDIR:-/tmp}/planner-operator-demo.XXXXXX")"
chmod 700 "$DEMO_DIR"
# procs.sh's start/stop_all/running, with the demo's own pid and log directories.
PIDS="$DEMO_DIR/pids"
LOGS="$DEMO_DIR/logs"
mkdir -p "$PIDS" "$LOGS"

started_cluster=false
created_namespace=false
created_topology=false
rbac_file=""
first_tick_at="" up_at="" down_at="" base_at="" policy_created=""
base_replicas="" base_total=0 peak_replicas="" peak_total=0
bed_status="" bed_cost=""

summary() {
  [[ -n "${policy_created:-}" ]] || return 0
  local since="since the policy was created"
  {
    printf '\n%s summary (%s):\n' "$(stamp)" "$since"
    if [[ -n "$first_tick_at" ]]; then
      printf '  first decision printed after %ds (%ds after the demo started)\n' \
        "$((first_tick_at - policy_created))" "$first_tick_at"
    else
      printf '  no decision yet\n'
    fi
    [[ -n "$up_at" ]] && printf '  scaled up from %s after %ds; peak %s\n' "$base_replicas" "$((up_at - policy_created))" "$peak_replicas"
    [[ -n "$down_at" ]] && printf '  scaled down from the peak after %ds\n' "$((down_at - policy_created))"
    [[ -n "$base_at" ]] && printf '  back to %s after %ds\n' "$base_replicas" "$((base_at - policy_created))"
    [[ -n "$first_tick_at" && -z "$up_at" ]] && printf '  no scale-up seen\n'
    [[ -n "$up_at" && -z "$down_at" ]] && printf '  no scale-down seen yet\n'
    if [[ -n "$bed_status" ]]; then
      printf '  Dynamo processes: at most %s engines at once, and the frontend; %s CPU-seconds over %ss (%s%% of a core), at most %s MiB resident at once\n' \
        "$(json_field peak_engines "$bed_status")" "$(json_field cpu_s "$bed_status" | cut -d. -f1)" \
        "$((SECONDS - bed_started))" "$(awk -v c="$(json_field cpu_s "$bed_status")" -v t="$((SECONDS - bed_started))" 'BEGIN { printf "%.0f", (t > 0 ? 100 * c / t : 0) }')" \
        "$(($(json_field peak_rss_bytes "$bed_status") / 1048576))"
      printf '  requests: %s sent, %s completed, %s failed, %s dropped\n' "$(json_field sent "$bed_status")" \
        "$(json_field completed "$bed_status")" "$(json_field failed "$bed_status")" "$(json_field dropped "$bed_status")"
      [[ -n "$bed_cost" ]] && printf '  the test bed itself (load generator, process supervision): %s\n' "$bed_cost"
    fi
  } >&2
}

# process_cost NAME: CPU-seconds and resident memory of a component this script started.
process_cost() {
  local pid bin
  [[ -f "$PIDS/$1.pid" ]] || return 0
  read -r pid bin <"$PIDS/$1.pid"
  is_ours "$pid" "$bin" || return 0
  awk -v tck="$(getconf CLK_TCK)" -v page="$(getconf PAGESIZE)" '
    FNR == 1 && FILENAME ~ /stat$/ { sub(/.*\) /, ""); split($0, f, " "); cpu = (f[12] + f[13]) / tck }
    FILENAME ~ /statm$/ { rss = $2 * page / 1048576 }
    END { printf "%.0f CPU-seconds, %.0f MiB resident", cpu, rss }' "/proc/$pid/stat" "/proc/$pid/statm" 2>/dev/null
}

# json_field NAME JSON: the number NAME in the test bed's /status (flat numeric fields only).
json_field() {
  sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" <<<"$2" | head -n 1
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +eu
  if [[ -n "${bed_started:-}" ]]; then
    bed_status="$(curl -sf --max-time 2 "http://127.0.0.1:$BED_PORT/status" || true)"
    bed_cost="$(process_cost bed)"
  fi
  summary
  step "cleaning up"
  stop_all
  if [[ "$started_cluster" == true ]]; then
    # The whole cluster goes, and with it the namespace, the RBAC and the ClusterTopologyBinding.
    bash ./cluster-down.sh
  else
    if [[ "$created_namespace" == true ]]; then
      log "deleting namespace $NS"
      k delete namespace "$NS" --wait=true --timeout=120s >/dev/null
    fi
    if [[ -n "$rbac_file" && -f "$rbac_file" ]]; then
      k delete -f "$rbac_file" --ignore-not-found --wait=false >/dev/null 2>&1
    fi
    if [[ "$created_topology" == true ]]; then
      k delete clustertopologybinding gpu-cluster --ignore-not-found >/dev/null
    fi
  fi
  rm -rf "$DEMO_DIR"
  if ((rc == 0)); then
    step "done; everything the demo started is stopped"
  else
    step "exit $rc; everything the demo started is stopped"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# fail_component NAME WHAT: a component died or did not come up; its log's end, then exit.
fail_component() {
  fail_with_log "$2" "$LOGS/$1.log"
}

# --- Cluster ----------------------------------------------------------------------------------
if [[ -n "${KUBECONFIG:-}" ]]; then
  step "using the cluster of KUBECONFIG=$KUBECONFIG ($(k config current-context 2>/dev/null || echo '?'))"
  k get --raw /readyz >/dev/null 2>&1 || fail "the cluster of KUBECONFIG=$KUBECONFIG is not reachable or not ready"
else
  if [[ -f "$RUN_DIR/admin.kubeconfig" ]] &&
    "$KUBECTL" --kubeconfig "$RUN_DIR/admin.kubeconfig" get --raw /readyz >/dev/null 2>&1; then
    step "the demo's cluster already runs in $RUN_DIR: using it (and leaving it running)"
  else
    step "starting the local control plane in $RUN_DIR (ports $((PLANNER_CLUSTER_PORT_BASE + 1))-$((PLANNER_CLUSTER_PORT_BASE + 5)))"
    started_cluster=true
    bash ./cluster-up.sh >/dev/null
  fi
  export KUBECONFIG="$RUN_DIR/admin.kubeconfig"
fi

# --- Operator binary (built while nothing else runs yet) ---------------------------------------
step "building the operator and the test bed (cargo build -p planner-operator -p planner-sim)"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
(cd "$REPO" && "${CARGO:-cargo}" build -p planner-operator --bin planner-operator -p planner-sim --bin planner-sim --locked)
BIN="$TARGET_DIR/debug/planner-operator"
SIM_BIN="$TARGET_DIR/debug/planner-sim"
[[ -x "$BIN" && -x "$SIM_BIN" ]] || fail "$BIN or $SIM_BIN was not built"

# --- CRDs, namespace, RBAC, samples ------------------------------------------------------------
# Grove's own ClusterTopologyBinding CRD (Grove ships it; this project ships no Grove CRD), for the
# sample binding the sample DGD names.
GROVE_CRD="$REPO/../shared/upstream/grove/grove.io_clustertopologybindings.yaml"
[[ -f "$GROVE_CRD" ]] || fail "$GROVE_CRD not found: the demo installs Grove's ClusterTopologyBinding CRD from ../shared/upstream beside the repository"
step "installing the CRDs (server-side apply of config/crd/ and Grove's ClusterTopologyBinding CRD)"
k apply --server-side --force-conflicts --field-manager="$FIELD_MANAGER" -f "$REPO/config/crd/" -f "$GROVE_CRD" >/dev/null
k wait --for condition=Established --timeout=60s -f "$REPO/config/crd/" -f "$GROVE_CRD" >/dev/null

if k get namespace "$NS" >/dev/null 2>&1; then
  fail "namespace $NS already exists (left by an earlier demo?): delete it (kubectl delete namespace $NS) or set DEMO_NAMESPACE"
fi
k create namespace "$NS" >/dev/null
created_namespace=true

# The chart's RBAC for the full operator (the demo's operator renders the DGD on fake nodes; the
# chart's default is planner only) in namespace-scoped mode (a Role in $NS; nodes and
# ClusterTopologies cluster-wide), without leader election and webhook, whose permissions this
# run does not use.
step "installing the chart's RBAC (helm template charts/planner-operator, dgdController.enabled=true, watchNamespace=$NS)"
rbac_file="$DEMO_DIR/rbac.yaml"
"$HELM" template "$RELEASE" "$REPO/charts/planner-operator" --namespace "$NS" \
  --set dgdController.enabled=true \
  --set watchNamespace="$NS" --set replicaCount=1 --set leaderElection.enabled=false \
  --set webhook.enabled=false --set dashboard.enabled=false --set metrics.service.enabled=false \
  --show-only templates/serviceaccount.yaml --show-only templates/rbac.yaml >"$rbac_file"
k apply -f "$rbac_file" >/dev/null

# The operator runs as that ServiceAccount: a kubeconfig with a token from the TokenRequest API.
op_kubeconfig="$DEMO_DIR/operator.kubeconfig"
k config view --minify --flatten >"$op_kubeconfig"
chmod 600 "$op_kubeconfig"
token="$(k create token "$SA" -n "$NS" --duration=24h)"
k --kubeconfig "$op_kubeconfig" config set-credentials demo-operator --token="$token" >/dev/null
k --kubeconfig "$op_kubeconfig" config set-context --current --user=demo-operator --namespace="$NS" >/dev/null
unset token

if ! k get clustertopologybinding gpu-cluster >/dev/null 2>&1; then
  created_topology=true
fi
k apply --server-side --field-manager="$FIELD_MANAGER" -f "$REPO/config/samples/cluster-topology.yaml" >/dev/null

# --- Operator ----------------------------------------------------------------------------------
step "starting the operator as system:serviceaccount:$NS:$SA (metrics on 127.0.0.1:$METRICS_PORT)"
# shellcheck disable=SC2030 # the operator's credentials, for it alone
(
  export KUBECONFIG="$op_kubeconfig" RUST_LOG="${RUST_LOG:-planner_operator=info,kube_runtime=warn,kube=warn,warn}"
  start operator "$BIN" run --namespace "$NS" --leader-election false --webhook-disabled \
    --metrics-addr "127.0.0.1:$METRICS_PORT" --prometheus-url "http://127.0.0.1:$PROM_PORT" \
    --identity "demo-$$"
) 2>/dev/null
wait_for operator "operator ready" 60 curl -sf --max-time 2 "http://127.0.0.1:$METRICS_PORT/readyz"

step "creating DGD $NS/$DGD (config/demo/dgd-demo.yaml); waiting for it to be Ready"
k create -n "$NS" -f "$REPO/config/demo/dgd-demo.yaml" >/dev/null
wait_for operator "DGD Ready" 120 k wait -n "$NS" "dgd/$DGD" --for condition=Ready --timeout=2s

# --- Trace, test bed, Prometheus ---------------------------------------------------------------
# 1 request/s for 30 s, a 90 s ramp to 8/s, 60 s at 8/s, a 90 s ramp down, 60 s at 1/s (then
# again, --loop); prompts of 8,000-16,000 tokens, 100-200 output tokens. Fixed seed. Long prompts
# at a few requests per second load the engines as short ones at many would, for a fraction of
# the CPU the real frontend and engines spend per request.
trace="$DEMO_DIR/trace.jsonl"
awk -v seed=7 -v period=330 -v low=1 -v high=8 -v up0=30 -v up1=120 -v dn0=180 -v dn1=270 '
  function rate(t) {
    if (t < up0) return low
    if (t < up1) return low + (high - low) * (t - up0) / (up1 - up0)
    if (t < dn0) return high
    if (t < dn1) return high + (low - high) * (t - dn0) / (dn1 - dn0)
    return low
  }
  BEGIN {
    srand(seed)
    for (s = 0; s < period; s++) {
      r = rate(s); n = int(r); if (rand() < r - n) n++
      for (i = 0; i < n; i++)
        printf "{\"timestamp\": %d, \"input_length\": %d, \"output_length\": %d}\n",
          (s + rand()) * 1000, 8000 + rand() * 8000, 100 + rand() * 100
    }
  }' >"$trace"

# The bed writes Prometheus's configuration: the scrape configurations of the chart's
# dynamoPodMonitors (what a cluster without NVIDIA's Dynamo operator installs; the frontend's and
# the engines' dynamo_namespace from their pods' nvidia.com/dynamo-namespace label, which the
# operator renders), every 2 s, and the operator's metrics.
"$HELM" template "$RELEASE" "$REPO/charts/planner-operator" --namespace "$NS" \
  --set dynamoPodMonitors.enabled=true --set "dynamoPodMonitors.namespaces={$NS}" \
  --show-only templates/dynamo-podmonitors.yaml >"$DEMO_DIR/podmonitors.yaml"
step "starting the test bed: Dynamo's frontend and engines for the DGD's Ready pods, and the load ($(wc -l <"$trace") requests over 330 s, looped); status on 127.0.0.1:$BED_PORT"
start bed "$SIM_BIN" dynamo-bed --dgd "$DGD" --namespace "$NS" --workdir "$DEMO_DIR/bed" \
  --python "$DYNAMO_PY" --model-dir "$DYNAMO_MODEL" --model "$MODEL_NAME" --profile "$PROFILE" \
  --system-ports "$ENGINE_PORTS" --trace "$trace" --loop --listen "127.0.0.1:$BED_PORT" \
  --prometheus-config "$DEMO_DIR/prometheus.yml" --pod-monitors "$DEMO_DIR/podmonitors.yaml" --scrape-interval-s 2 \
  --prometheus-job "planner-operator=127.0.0.1:$METRICS_PORT" 2>/dev/null
bed_started=$SECONDS
wait_for bed "the Dynamo frontend serves $MODEL_NAME; the load starts" 120 \
  bash -c "curl -sf --max-time 2 http://127.0.0.1:$BED_PORT/status | grep -q '\"started\":true'"
trace_started=$SECONDS

step "starting Prometheus on 127.0.0.1:$PROM_PORT ($PROMETHEUS)"
start prometheus "$PROMETHEUS" --config.file="$DEMO_DIR/prometheus.yml" \
  --storage.tsdb.path="$DEMO_DIR/prometheus-data" --storage.tsdb.retention.time=1d \
  --web.listen-address="127.0.0.1:$PROM_PORT" 2>/dev/null
wait_for prometheus "Prometheus ready" 60 curl -sf --max-time 2 "http://127.0.0.1:$PROM_PORT/-/ready"

step "creating PlannerPolicy $NS/$POLICY (config/demo/plannerpolicy-demo.yaml: sla, every ${INTERVAL_S}s)"
k create -n "$NS" -f "$REPO/config/demo/plannerpolicy-demo.yaml" >/dev/null
policy_created=$SECONDS

# shellcheck disable=SC2031 # the admin kubeconfig, not the operator's
cat >&2 <<EOF
$(stamp) the loop runs. Look around while it does:
         Prometheus  http://127.0.0.1:$PROM_PORT/api/v1/query?query=dynamo_frontend_requests_total
                     (dynamo_frontend_*, planner_operator_*; the one \`make tools\` builds has the API, no web UI)
         kubectl     KUBECONFIG=$KUBECONFIG $KUBECTL -n $NS get dgd,ppol,pods
         test bed    http://127.0.0.1:$BED_PORT/status (processes, engines, load, CPU and memory)
         logs        $LOGS/{operator,bed,prometheus}.log, $DEMO_DIR/bed/logs/<pod>.log (Dynamo's)
         $(if [[ -n "$DEMO_SECONDS" ]]; then echo "stopping after ${DEMO_SECONDS}s (DEMO_SECONDS)"; else echo "Ctrl-C stops the demo and cleans up"; fi)
EOF

# --- One line per planner interval --------------------------------------------------------------
# observed: requests/s over the interval, mean ISL/OSL (tokens), mean TTFT/ITL (ms); predicted:
# requests/s, ISL, OSL of the next interval; replicas: prefill/decode when the interval ran, and
# what the planner decided (the DGD is scaled to it); engines: prefill/decode processes running.
JSONPATH='{.status.lastTickTime}{"\t"}{.status.observed.requests}{"\t"}{.status.observed.isl}{"\t"}{.status.observed.osl}{"\t"}{.status.observed.ttftMs}{"\t"}{.status.observed.itlMs}{"\t"}{.status.predicted.requests}{"\t"}{.status.predicted.isl}{"\t"}{.status.predicted.osl}{"\t"}{.status.current.prefill}{"\t"}{.status.current.decode}{"\t"}{.status.desired.prefill}{"\t"}{.status.desired.decode}{"\t"}{.status.message}'

header() {
  printf '%6s  %-8s | %-36s | %-20s | %-19s | %s\n' "" "" "observed" "predicted" "prefill/decode" ""
  printf '%6s  %-8s | %6s %6s %5s %8s %6s | %6s %6s %5s | %4s %-6s %-7s | %s\n' \
    "t" "tick" "req/s" "ISL" "OSL" "TTFT ms" "ITL ms" "req/s" "ISL" "OSL" "now" "next" "engines" "message"
}

# format_line T ENGINES FIELDS...: one aligned line; missing values print as "-".
format_line() {
  awk -F'\t' -v t="$1" -v engines="$2" -v iv="$INTERVAL_S" '
    function num(v, fmt) { return v == "" ? "-" : sprintf(fmt, v) }
    function rps(v) { return v == "" ? "-" : sprintf("%.1f", v / iv) }
    {
      tick = $1; sub(/^.*T/, "", tick); sub(/Z$/, "", tick)
      now = ($10 == "" ? "-" : $10 "/" $11); next_ = ($12 == "" ? "-" : $12 "/" $13)
      printf "%5ds  %-8s | %6s %6s %5s %8s %6s | %6s %6s %5s | %4s %-6s %-7s | %s\n",
        t, tick, rps($2), num($3, "%.0f"), num($4, "%.0f"), num($5, "%.1f"), num($6, "%.2f"),
        rps($7), num($8, "%.0f"), num($9, "%.0f"), now, next_, engines, $14
    }'
}


last_tick=""
lines=0
while true; do
  for name in operator bed prometheus; do
    running "$name" || fail_component "$name" "$name exited"
  done
  if [[ -n "$DEMO_SECONDS" ]] && ((SECONDS - policy_created >= DEMO_SECONDS)); then
    step "DEMO_SECONDS=$DEMO_SECONDS reached"
    break
  fi
  row="$(k get ppol "$POLICY" -n "$NS" -o jsonpath="$JSONPATH" 2>/dev/null || true)"
  tick="${row%%$'\t'*}"
  if [[ -n "$tick" && "$tick" != "$last_tick" ]]; then
    last_tick="$tick"
    ((lines % 20 == 0)) && header
    lines=$((lines + 1))
    status="$(curl -sf --max-time 2 "http://127.0.0.1:$BED_PORT/status" || true)"
    engines="$(json_field prefill "$status")/$(json_field decode "$status")"
    peak_engines="$(json_field peak_engines "$status")"
    format_line "$((SECONDS - trace_started))" "$engines" <<<"$row"
    IFS=$'\t' read -r _ _ _ _ _ _ _ _ _ cur_p cur_d want_p want_d _ <<<"$row"
    if [[ -n "$want_p" && -n "$want_d" ]]; then
      total=$((want_p + want_d))
      if [[ -z "$first_tick_at" ]]; then
        first_tick_at=$SECONDS
        base_replicas="${cur_p:-$want_p}/${cur_d:-$want_d}"
        base_total=$((${cur_p:-$want_p} + ${cur_d:-$want_d}))
        peak_replicas="$base_replicas" peak_total=$base_total
      fi
      if ((total > peak_total)); then
        peak_total=$total peak_replicas="$want_p/$want_d"
        [[ -z "$up_at" ]] && up_at=$SECONDS
      fi
      if [[ -n "$up_at" && -z "$down_at" ]] && ((total < peak_total)); then down_at=$SECONDS; fi
      if [[ -n "$down_at" && -z "$base_at" ]] && ((total <= base_total)); then base_at=$SECONDS; fi
    fi
    if [[ -n "$EXPECT_SCALING" && -n "$down_at" ]] && ((${peak_engines:-0} >= 3)); then
      step "the replicas went up and down again, with ${peak_engines} engine processes at the peak (DEMO_EXPECT_SCALING): stopping"
      break
    fi
  fi
  sleep 1
done

# What a user watching the policy sees: replicas serving/decided, TTFT and ITL observed/target,
# the share of the last hour's intervals that met the SLA, what limited the last decision.
get_ppol="$(k get ppol "$POLICY" -n "$NS" 2>&1 || true)"
printf '\n$ kubectl get ppol %s\n%s\n' "$POLICY" "$get_ppol"

if [[ -n "$EXPECT_SCALING" ]]; then
  # PREFILL and DECODE as serving/decided, TTFT and ITL as observed/target in ms, SLA a share.
  awk 'NR == 2 && $4 ~ /^[0-9]+\/[0-9]+$/ && $5 ~ /^[0-9]+\/[0-9]+$/ && $6 ~ /^[0-9.]+\/[0-9]+ms$/ && $7 ~ /^[0-9.]+\/[0-9]+ms$/ && $8 ~ /^[0-9]+%$/ { ok = 1 } END { exit !ok }' <<<"$get_ppol" ||
    fail_component operator "DEMO_EXPECT_SCALING: kubectl get ppol does not show serving/decided, observed/target and SLA"
  [[ -n "$up_at" ]] || fail_component operator "DEMO_EXPECT_SCALING: no scale-up within ${DEMO_SECONDS}s"
  [[ -n "$down_at" ]] || fail_component operator "DEMO_EXPECT_SCALING: scaled up, but not down again within ${DEMO_SECONDS}s"
  ((${peak_engines:-0} >= 3)) || fail_component bed "DEMO_EXPECT_SCALING: at most ${peak_engines:-0} engine processes at once, not 3"
fi
