# shellcheck shell=bash disable=SC2034 # variables for the scripts that source this file
# Shared by tools/*.sh (sourced, not run): where the tools cache and the cluster's run directory
# live, and how errors are reported. Nothing here writes inside the repo.

TOOLS_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Bump when the build recipe (flags, binary list) changes, so cached binaries are rebuilt.
TOOLS_RECIPE=5

TOOLS_CACHE="${PLANNER_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/planner-operator/tools}"
TOOLS_KEY="$(
  cd "$TOOLS_SRC" &&
    { echo "recipe $TOOLS_RECIPE"; cat ./*/go.mod ./*/go.sum ./image/*.go; } | sha256sum | cut -c1-16
)"
TOOLS_DIR="$TOOLS_CACHE/$TOOLS_KEY"
TOOLS_BIN="$TOOLS_DIR/bin"

# Dynamo's frontend, mocker engines and replay (tools/dynamo-venv.sh): a virtual environment and
# the test model directory, keyed by the pinned requirements and the model script.
DYNAMO_VERSION=1.6.1
DYNAMO_CACHE="${PLANNER_DYNAMO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/planner-operator/dynamo}"
DYNAMO_KEY="$(cd "$TOOLS_SRC" && cat dynamo/requirements.txt dynamo/runtime-requirements.txt dynamo/make_model.py | sha256sum | cut -c1-16)"
DYNAMO_DIR="$DYNAMO_CACHE/$DYNAMO_VERSION-$DYNAMO_KEY"

# The local cluster's state (certs, kubeconfigs, data, logs, pids); one cluster per user.
RUN_DIR="${PLANNER_CLUSTER_DIR:-${XDG_RUNTIME_DIR:-${TMPDIR:-/tmp}}/planner-operator-cluster-$(id -u)}"

log() { printf '%s\n' "$*" >&2; }

fail() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}

# fail_with_log MESSAGE LOGFILE: one clear line, then the end of the component's log.
fail_with_log() {
  printf 'error: %s\n' "$1" >&2
  if [[ -s "$2" ]]; then
    printf -- '--- last lines of %s ---\n' "$2" >&2
    tail -n "${LOG_TAIL_LINES:-25}" "$2" >&2
    printf -- '---\n' >&2
  fi
  exit 1
}

# The modules declare go 1.26.0 and GOTOOLCHAIN=local forbids fetching a newer toolchain.
need_go() {
  command -v go >/dev/null 2>&1 ||
    fail "Go toolchain not found on PATH: building the control plane needs Go >= 1.26 (https://go.dev/doc/install)"
  local version
  version="$(go env GOVERSION 2>/dev/null || true)"
  version="${version#go}"
  local major minor
  IFS=. read -r major minor _ <<<"$version"
  minor="${minor%%[!0-9]*}" # go1.27rc1
  if [[ -z "$major" || -z "$minor" ]] || ((major < 1 || (major == 1 && minor < 26))); then
    fail "Go ${version:-unknown} found at $(command -v go), but building the control plane needs Go >= 1.26"
  fi
}

# prometheus_bin: the one place that decides which Prometheus the demo and the e2e tests run.
# PROMETHEUS_BIN when set; else an installed `prometheus` on PATH (a Debian package, say), the
# tools cache's own bin directory skipped, since `make cluster-up` puts it first on PATH; else the
# one `make tools` builds from tools/prometheus. Prints its path; fails when there is none.
prometheus_bin() {
  if [[ -n "${PROMETHEUS_BIN:-}" ]]; then
    [[ -f "$PROMETHEUS_BIN" && -x "$PROMETHEUS_BIN" ]] || fail "PROMETHEUS_BIN=$PROMETHEUS_BIN is not an executable file"
    printf '%s\n' "$PROMETHEUS_BIN"
    return 0
  fi
  local dir
  local -a dirs
  IFS=: read -ra dirs <<<"$PATH"
  for dir in "${dirs[@]}"; do
    [[ -n "$dir" && "$dir" != "$TOOLS_BIN" ]] || continue
    # -f: a binary hidden by tools/without-system-packages.sh is /dev/null, not a file.
    if [[ -f "$dir/prometheus" && -x "$dir/prometheus" ]]; then
      printf '%s\n' "$dir/prometheus"
      return 0
    fi
  done
  if [[ -f "$TOOLS_BIN/prometheus" && -x "$TOOLS_BIN/prometheus" ]]; then
    printf '%s\n' "$TOOLS_BIN/prometheus"
    return 0
  fi
  return 1
}

# need_python: PYTHON (default python3) is a Python >= 3.10 with the venv module, as Dynamo needs.
need_python() {
  PYTHON="${PYTHON:-python3}"
  command -v "$PYTHON" >/dev/null 2>&1 ||
    fail "$PYTHON not found on PATH: Dynamo's frontend and engines need a Python >= 3.10 with venv (set PYTHON to use another)"
  "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' ||
    fail "$("$PYTHON" --version 2>&1) at $(command -v "$PYTHON"): Dynamo needs Python >= 3.10 (set PYTHON to use another)"
  "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null ||
    fail "$PYTHON has no venv/ensurepip module (Debian: apt install python3-venv)"
}

# dynamo_python, dynamo_model_dir: the python of the environment tools/dynamo-venv.sh installed,
# and the model directory it wrote; fail when it has not run.
dynamo_python() {
  [[ -f "$DYNAMO_DIR/.complete" ]] || fail "Dynamo $DYNAMO_VERSION is not installed: run \`make dynamo\` (tools/dynamo-venv.sh)"
  printf '%s\n' "$DYNAMO_DIR/venv/bin/python"
}
dynamo_model_dir() {
  [[ -f "$DYNAMO_DIR/.complete" ]] || fail "Dynamo $DYNAMO_VERSION is not installed: run \`make dynamo\` (tools/dynamo-venv.sh)"
  printf '%s\n' "$DYNAMO_DIR/model"
}
