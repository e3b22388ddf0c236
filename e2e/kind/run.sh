#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR/../../tools
# `make e2e-kind`: the e2e suite on a kind cluster, for machines with Docker. Creates the kind
# cluster (e2e/kind/cluster.yaml), runs kwok next to it as a local process (built by
# `make tools`, managing only nodes annotated kwok.x-k8s.io/node=fake), creates the same fake
# GPU nodes and operator service account as `make cluster-up`, runs `cargo test -p e2e
# --features e2e`, and deletes the cluster again (kept when E2E_KIND_KEEP is set).
set -euo pipefail
cd "$(dirname "$0")/../../tools"
# Its own state directory, so it never touches a running `make cluster-up`.
export PLANNER_CLUSTER_DIR="${PLANNER_KIND_DIR:-${XDG_RUNTIME_DIR:-${TMPDIR:-/tmp}}/planner-operator-kind-$(id -u)}"
source ./env.sh
source ./procs.sh
source ./fake-cluster.sh

NAME="${KIND_CLUSTER_NAME:-planner-e2e}"
# Kubernetes 1.36, as the local control plane and the k8s-openapi feature; the digest is the one
# kind v0.33.0 lists for this image (use the image your kind release lists, by digest).
IMAGE="${KIND_NODE_IMAGE:-kindest/node:v1.36.4@sha256:099e049362a1526b2db71494e1947aae99bd16290d7c895f2b7ea312e3cbfaed}"
ADMIN_KUBECONFIG="$RUN_DIR/admin.kubeconfig"
# shellcheck disable=SC2034 # read by write_operator_kubeconfig (fake-cluster.sh)
OPERATOR_KUBECONFIG="$RUN_DIR/operator.kubeconfig"

for cmd in kind docker; do
  command -v "$cmd" >/dev/null 2>&1 || fail "$cmd not found on PATH: make e2e-kind needs Docker and kind (https://kind.sigs.k8s.io)"
done
[[ -f "$TOOLS_DIR/.complete" ]] || fail "tools are not built for this checkout: run \`make tools\` first"
if kind get clusters 2>/dev/null | grep -qx "$NAME"; then
  fail "a kind cluster named $NAME exists already: \`kind delete cluster --name $NAME\`, or set KIND_CLUSTER_NAME"
fi

rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR" "$LOGS" "$PIDS"
cleanup() {
  stop_all
  if [[ -n "${E2E_KIND_KEEP:-}" ]]; then
    log "E2E_KIND_KEEP is set: keeping kind cluster $NAME (KUBECONFIG=$ADMIN_KUBECONFIG; kwok is stopped)"
  else
    kind delete cluster --name "$NAME" >&2 || true
    rm -rf "$RUN_DIR"
  fi
}
trap cleanup EXIT

log "creating kind cluster $NAME ($IMAGE)"
kind create cluster --name "$NAME" --image "$IMAGE" --config "$TOOLS_SRC/../e2e/kind/cluster.yaml" \
  --kubeconfig "$ADMIN_KUBECONFIG" --wait 180s >&2
KUBECTL=("$TOOLS_BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG")
"${KUBECTL[@]}" taint nodes -l node-role.kubernetes.io/control-plane \
  node-role.kubernetes.io/control-plane:NoSchedule --overwrite >&2

start_kwok
create_fake_nodes
write_operator_kubeconfig

cd "$TOOLS_SRC/.."
PROMETHEUS_BIN="$(prometheus_bin)" || fail "no Prometheus: \`make tools\` builds one"
export PROMETHEUS_BIN
"${CARGO:-cargo}" build -p planner-operator --bin planner-operator -p planner-sim --bin planner-sim --locked
KUBECONFIG="$ADMIN_KUBECONFIG" HELM="${HELM:-$TOOLS_BIN/helm}" PROMTOOL="${PROMTOOL:-$TOOLS_BIN/promtool}" "${CARGO:-cargo}" test -p e2e --features e2e --locked --test e2e -- "$@"
