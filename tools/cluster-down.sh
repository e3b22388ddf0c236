#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Stops every process `cluster-up.sh` started (also after a failed start) and removes the run
# directory: certificates, kubeconfigs, etcd data and logs.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
source ./procs.sh

if [[ ! -d "$RUN_DIR" ]]; then
  log "no local cluster in $RUN_DIR"
  exit 0
fi
stop_all
rm -rf "$RUN_DIR"
log "local cluster stopped; removed $RUN_DIR"
