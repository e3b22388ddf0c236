#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Runs the end-to-end tests (`cargo test -p e2e --features e2e`) against KUBECONFIG, or, when
# KUBECONFIG is unset, against the local cluster of `make cluster-up`. Never falls back to
# ~/.kube/config: the tests create CRDs and namespaces, so the cluster must be named on purpose.
# Arguments are passed to the test binary (a test name filter, --nocapture).
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh

# The apiserver-restart test runs on this checkout's local cluster only (KUBECONFIG unset), not
# on CI's: there the restarted kube-apiserver has once never listened again, for a reason not
# yet known (the test prints the end of the apiserver's log when that happens).
local_cluster=0
if [[ -z "${KUBECONFIG:-}" && -f "$RUN_DIR/pids/kube-apiserver.pid" ]]; then
  local_cluster=1
fi
if [[ -z "${KUBECONFIG:-}" ]]; then
  [[ -f "$RUN_DIR/admin.kubeconfig" ]] ||
    fail "KUBECONFIG is not set and no local cluster runs: \`make cluster-up\` first, or point KUBECONFIG at a test cluster"
  export KUBECONFIG="$RUN_DIR/admin.kubeconfig"
fi
# The chart tests run helm and promtool; use those `make tools` built unless HELM or PROMTOOL
# names another.
if [[ -z "${HELM:-}" && -x "$TOOLS_BIN/helm" ]]; then
  export HELM="$TOOLS_BIN/helm"
fi
if [[ -z "${PROMTOOL:-}" && -x "$TOOLS_BIN/promtool" ]]; then
  export PROMTOOL="$TOOLS_BIN/promtool"
fi
# The closed-loop test runs a real Prometheus, `prometheus` from PATH: make that the one
# prometheus_bin (env.sh) picks, an installed one or else the one `make tools` builds, through a
# directory of its own first on PATH (so nothing else on PATH changes). Exported as PROMETHEUS_BIN.
if PROMETHEUS_BIN="$(prometheus_bin)"; then
  export PROMETHEUS_BIN
  if [[ "$(command -v prometheus || true)" != "$PROMETHEUS_BIN" ]]; then
    prometheus_dir="$(mktemp -d "${TMPDIR:-/tmp}/planner-operator-e2e-prometheus.XXXXXX")"
    trap 'rm -rf "$prometheus_dir"' EXIT
    ln -s "$PROMETHEUS_BIN" "$prometheus_dir/prometheus"
    export PATH="$prometheus_dir:$PATH"
  fi
  log "Prometheus for the closed-loop test: $PROMETHEUS_BIN"
else
  unset PROMETHEUS_BIN
  log "warning: no prometheus installed and none built (make tools builds one): the closed-loop test will fail"
fi
# The closed-loop tests run NVIDIA Dynamo's real frontend and engines (the test bed of
# `planner-sim dynamo-bed`), the real-metrics and conformance tests run them directly, and the
# topology tests run the released runtime's topology reader on what worker pods get: the
# virtual environment `make dynamo` installs (a no-op once cached), named in DYNAMO_PYTHON
# (unless set) and DYNAMO_MODEL_DIR.
bash "$TOOLS_SRC/dynamo-venv.sh"
DYNAMO_PYTHON="${DYNAMO_PYTHON:-$(dynamo_python)}"
DYNAMO_MODEL_DIR="$(dynamo_model_dir)"
export DYNAMO_PYTHON DYNAMO_MODEL_DIR
log "Dynamo for the bed, the real-metrics and the topology conformance tests: $DYNAMO_PYTHON"
log "e2e tests against KUBECONFIG=$KUBECONFIG"
cd "$TOOLS_SRC/.."
# Tests that run the operator as separate processes (leader election) use this binary, and the
# closed loop runs the test bed of planner-sim (others its synthetic frontend).
"${CARGO:-cargo}" build -p planner-operator --bin planner-operator -p planner-sim --bin planner-sim --locked
# Not exec: the EXIT trap removes the PATH directory afterwards.
if [[ $# -eq 0 ]]; then
  # Tests that delete or replace (with NVIDIA's or an earlier Grove's real CRDs) shared CRDs:
  # alone, before the others (each puts the usual CRDs back).
  "${CARGO:-cargo}" test -p e2e --features e2e --locked --test e2e -- --ignored --exact \
    crd_race::operator_started_before_its_crds_reconciles_once_they_are_served \
    dynamo_operator::planner_only_on_nvidias_current_crds_scales_upstreams_examples \
    dynamo_operator::planner_only_on_dynamo_1_1_crds_scales_at_v1alpha1 \
    dynamo_operator::conversion_through_nvidias_webhook_and_its_outage \
    topology::nvidias_kv_transfer_policy_with_groves_earlier_cluster_topology
fi
"${CARGO:-cargo}" test -p e2e --features e2e --locked --test e2e -- "$@"
if [[ $# -eq 0 && $local_cluster -eq 1 ]]; then
  # Kills and restarts the local cluster's kube-apiserver: last, and only there.
  "${CARGO:-cargo}" test -p e2e --features e2e --locked --test e2e -- --ignored --exact \
    faults::an_apiserver_restart_resumes_the_watches_and_repeats_nothing
fi
