#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Starts a local Kubernetes control plane on 127.0.0.1 from the binaries `tools/build.sh` built:
# etcd, kube-apiserver (RBAC), kube-controller-manager, kube-scheduler and kwok with fake GPU
# nodes. Waits until the API is ready and every node is Ready. Progress goes to stderr; stdout
# is only the last two lines, `export KUBECONFIG=...` and `export PATH=...`, so that
# `eval "$(make -s cluster-up)"` prepares a shell. On a failed start every process it started is
# stopped again (the logs stay in the run directory until `make cluster-down`).
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
source ./procs.sh
source ./fake-cluster.sh

[[ -f "$TOOLS_DIR/.complete" ]] || fail "tools are not built for this checkout ($TOOLS_DIR): run \`make tools\` first"
for cmd in openssl curl base64; do
  command -v "$cmd" >/dev/null 2>&1 || fail "$cmd not found on PATH: cluster-up needs it"
done

# Ports on 127.0.0.1; PLANNER_CLUSTER_PORT_BASE moves them all (two clusters, or a clash).
base="${PLANNER_CLUSTER_PORT_BASE:-16440}"
ETCD_PORT=$((base + 1))
ETCD_PEER_PORT=$((base + 2))
APISERVER_PORT=$((base + 3))
KCM_PORT=$((base + 4))
SCHEDULER_PORT=$((base + 5))
TIMEOUT="${PLANNER_CLUSTER_TIMEOUT:-120}"

ADMIN_KUBECONFIG="$RUN_DIR/admin.kubeconfig"
OPERATOR_KUBECONFIG="$RUN_DIR/operator.kubeconfig"
PKI="$RUN_DIR/pki"

print_exports() {
  log "cluster ready: KUBECONFIG=$ADMIN_KUBECONFIG (operator service account: $OPERATOR_KUBECONFIG)"
  printf 'export KUBECONFIG=%s\n' "$ADMIN_KUBECONFIG"
  # shellcheck disable=SC2016 # $PATH is expanded by the shell that evals this line
  printf 'export PATH=%s:$PATH\n' "$TOOLS_BIN"
}

if any_running; then
  if curl -sf --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://127.0.0.1:$APISERVER_PORT/readyz" >/dev/null 2>&1; then
    log "a local cluster is already running in $RUN_DIR"
    print_exports
    exit 0
  fi
  fail "a local cluster in $RUN_DIR is partly running and not healthy: run \`make cluster-down\` first"
fi

rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR" "$PKI" "$LOGS" "$PIDS"
chmod 700 "$RUN_DIR"

started_ok=false
on_exit() {
  if [[ "$started_ok" != true ]]; then
    stop_all
    log "start failed; everything it started is stopped. Logs: $LOGS (removed by \`make cluster-down\`)"
  fi
}
trap on_exit EXIT

for entry in "etcd:$ETCD_PORT" "etcd-peer:$ETCD_PEER_PORT" "kube-apiserver:$APISERVER_PORT" \
  "kube-controller-manager:$KCM_PORT" "kube-scheduler:$SCHEDULER_PORT"; do
  port="${entry##*:}"
  if port_in_use "$port"; then
    fail "port $port on 127.0.0.1 (for ${entry%%:*}) is in use; stop what holds it or set PLANNER_CLUSTER_PORT_BASE (now $base)"
  fi
done

# --- PKI: one CA, a serving cert, an admin client cert, a service-account signing key. ---------
log "generating certificates in $PKI"
ssl_log="$LOGS/openssl.log"
ssl() { openssl "$@" >>"$ssl_log" 2>&1 || fail_with_log "openssl $1 failed" "$ssl_log"; }
new_key() { ssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
# sign NAME SUBJECT EXTENSIONS: a cert for NAME.key, signed by the CA.
sign() {
  local ext="$PKI/$1.ext"
  printf '%b\n' "$3" >"$ext"
  ssl req -new -key "$PKI/$1.key" -subj "$2" -out "$PKI/$1.csr"
  ssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -set_serial "0x$(openssl rand -hex 8)" \
    -days 3650 -sha256 -extfile "$ext" -out "$PKI/$1.crt"
}
new_key "$PKI/ca.key"
ssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=planner-operator-local-ca" -days 3650 -sha256 \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$PKI/ca.crt"
new_key "$PKI/apiserver.key"
sign apiserver "/CN=kube-apiserver" \
  "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
new_key "$PKI/admin.key"
sign admin "/O=system:masters/CN=admin" \
  "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth"
new_key "$PKI/sa.key"
ssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub"
chmod 600 "$PKI"/*.key

b64() { base64 -w0 <"$1"; }
cat >"$ADMIN_KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: planner-local
    cluster:
      server: https://127.0.0.1:$APISERVER_PORT
      certificate-authority-data: $(b64 "$PKI/ca.crt")
users:
  - name: admin
    user:
      client-certificate-data: $(b64 "$PKI/admin.crt")
      client-key-data: $(b64 "$PKI/admin.key")
contexts:
  - name: planner-local
    context: {cluster: planner-local, user: admin}
current-context: planner-local
EOF
chmod 600 "$ADMIN_KUBECONFIG"

KUBECTL=("$TOOLS_BIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG")
api_ready() {
  curl -sf --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
    "https://127.0.0.1:$APISERVER_PORT/readyz" >/dev/null 2>&1
}

# --- etcd ------------------------------------------------------------------------------------
# No fsync: the data is thrown away with the cluster, and fsync dominates on slow disks.
start etcd "$TOOLS_BIN/etcd" --name=n0 --data-dir="$RUN_DIR/etcd" \
  --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="n0=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync=true \
  --listen-metrics-urls="" --log-level=warn
wait_for etcd "etcd healthy" 30 curl -sf --max-time 3 "http://127.0.0.1:$ETCD_PORT/health"

# --- kube-apiserver --------------------------------------------------------------------------
# --advertise-address: without it a loopback-bound apiserver looks for a host interface with a
# default route. --endpoint-reconciler-type=none keeps that loopback address out of the
# `kubernetes` Service's endpoints. A /16 service range: the memory benchmark creates 500 frontend
# Services, more than a /24 holds.
start kube-apiserver "$TOOLS_BIN/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$APISERVER_PORT" \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-cluster-ip-range=10.0.0.0/16 \
  --authorization-mode=RBAC \
  --allow-privileged=true \
  --endpoint-reconciler-type=none \
  --profiling=false
wait_for kube-apiserver "kube-apiserver /readyz" "$TIMEOUT" api_ready

# --- controller-manager and scheduler (ReplicaSets, pods, default service accounts, binding) --
# shellcheck disable=SC2054 # the commas are part of the flag's value
common=(--kubeconfig="$ADMIN_KUBECONFIG" --authentication-kubeconfig="$ADMIN_KUBECONFIG"
  --authorization-kubeconfig="$ADMIN_KUBECONFIG" --leader-elect=false --bind-address=127.0.0.1
  --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics)
start kube-controller-manager "$TOOLS_BIN/kube-controller-manager" "${common[@]}" \
  --secure-port="$KCM_PORT" --cert-dir="$RUN_DIR/kcm" \
  --root-ca-file="$PKI/ca.crt" --service-account-private-key-file="$PKI/sa.key" \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --profiling=false
start kube-scheduler "$TOOLS_BIN/kube-scheduler" "${common[@]}" \
  --secure-port="$SCHEDULER_PORT" --cert-dir="$RUN_DIR/scheduler" --profiling=false
wait_for kube-controller-manager "kube-controller-manager /healthz" 60 \
  curl -skf --max-time 3 "https://127.0.0.1:$KCM_PORT/healthz"
wait_for kube-scheduler "kube-scheduler /healthz" 60 \
  curl -skf --max-time 3 "https://127.0.0.1:$SCHEDULER_PORT/healthz"

# --- kwok with fake GPU nodes, and the operator's service account ----------------------------
start_kwok
create_fake_nodes
# The default service account proves the controller-manager's controllers run.
wait_for kube-controller-manager "default service account created" 60 \
  "${KUBECTL[@]}" -n default get serviceaccount default
write_operator_kubeconfig

started_ok=true
print_exports
