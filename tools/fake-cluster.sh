# shellcheck shell=bash
# What the local control plane and kind share (sourced after env.sh and procs.sh, not run): kwok
# as a process next to the API server, fake GPU nodes with topology labels, and a kubeconfig for
# the operator's service account. Expects ADMIN_KUBECONFIG, OPERATOR_KUBECONFIG and KUBECTL.

# Fake GPU nodes: zones x racks x nodes per rack, each with this many GPUs.
ZONES="${PLANNER_CLUSTER_ZONES:-2}"
RACKS="${PLANNER_CLUSTER_RACKS_PER_ZONE:-2}"
NODES="${PLANNER_CLUSTER_NODES_PER_RACK:-2}"
GPUS="${PLANNER_CLUSTER_GPUS_PER_NODE:-8}"

# kwok manages only nodes with this annotation, so it never touches a real (kind) node.
# No --server-address and no --node-port: kwok then opens no port (no logs/exec on fake pods).
start_kwok() {
  local stages="$TOOLS_DIR/kwok-stages"
  start kwok "$TOOLS_BIN/kwok" --kubeconfig="$ADMIN_KUBECONFIG" \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-ip=127.0.0.1 --cidr=10.244.0.0/16 --node-lease-duration-seconds=40 \
    --config="$stages/node-initialize.yaml,$stages/node-heartbeat-with-lease.yaml,$stages/pod-ready.yaml,$stages/pod-complete.yaml,$stages/pod-delete.yaml"
}

# Untainted, so plain pods (no tolerations) schedule on them. Named gpu-<zone><rack>-<n>.
create_fake_nodes() {
  local nodes_yaml="$RUN_DIR/nodes.yaml" letters=(a b c d e f g h i j k l m n o p q r s t u v w x y z)
  local z r n zone rack name
  FAKE_NODE_COUNT=0
  : >"$nodes_yaml"
  for z in $(seq 0 $((ZONES - 1))); do
    zone="zone-${letters[z]}"
    for r in $(seq 1 "$RACKS"); do
      rack="${letters[z]}$r"
      for n in $(seq 1 "$NODES"); do
        name="gpu-$rack-$n"
        FAKE_NODE_COUNT=$((FAKE_NODE_COUNT + 1))
        cat >>"$nodes_yaml" <<YAML
---
apiVersion: v1
kind: Node
metadata:
  name: $name
  annotations:
    kwok.x-k8s.io/node: fake
  labels:
    type: kwok
    kubernetes.io/hostname: $name
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    topology.kubernetes.io/zone: $zone
    nvidia.com/rack: rack-$rack
    nvidia.com/gpu.present: "true"
status:
  allocatable: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "$GPUS"}
  capacity: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "$GPUS"}
YAML
      done
    done
  done
  log "creating $FAKE_NODE_COUNT fake GPU nodes ($ZONES zones x $RACKS racks x $NODES nodes, $GPUS GPUs each)"
  "${KUBECTL[@]}" apply -f "$nodes_yaml" >>"$LOGS/kubectl.log" 2>&1 ||
    fail_with_log "creating the kwok nodes failed" "$LOGS/kubectl.log"
  wait_for kwok "all $FAKE_NODE_COUNT fake nodes Ready" 60 fake_nodes_ready
}

fake_nodes_ready() {
  local ready
  ready="$("${KUBECTL[@]}" get nodes -l type=kwok \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
    grep -c '^True$')"
  [[ "$ready" -eq "$FAKE_NODE_COUNT" ]]
}

# The operator's service account planner-operator in planner-operator-system, and a kubeconfig
# that authenticates as it with a bound token (RBAC for it comes with the chart).
write_operator_kubeconfig() {
  local server ca token
  {
    "${KUBECTL[@]}" create namespace planner-operator-system --dry-run=client -o yaml |
      "${KUBECTL[@]}" apply -f -
    "${KUBECTL[@]}" -n planner-operator-system create serviceaccount planner-operator --dry-run=client -o yaml |
      "${KUBECTL[@]}" apply -f -
  } >>"$LOGS/kubectl.log" 2>&1 || fail_with_log "creating the operator's service account failed" "$LOGS/kubectl.log"
  token="$("${KUBECTL[@]}" -n planner-operator-system create token planner-operator --duration=720h 2>>"$LOGS/kubectl.log")" ||
    fail_with_log "requesting a token for the operator's service account failed" "$LOGS/kubectl.log"
  server="$("${KUBECTL[@]}" config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')"
  ca="$("${KUBECTL[@]}" config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
  cat >"$OPERATOR_KUBECONFIG" <<YAML
apiVersion: v1
kind: Config
clusters:
  - name: cluster
    cluster:
      server: $server
      certificate-authority-data: $ca
users:
  - name: planner-operator
    user:
      token: $token
contexts:
  - name: planner-operator
    context: {cluster: cluster, user: planner-operator, namespace: planner-operator-system}
current-context: planner-operator
YAML
  chmod 600 "$OPERATOR_KUBECONFIG"
}
