#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Installs NVIDIA Dynamo's frontend, mocker engine and offline replay (PyPI `ai-dynamo` and
# `ai-dynamo-runtime`, pinned in tools/dynamo/) into a virtual environment in the tools cache,
# and writes the test model directory they serve (tools/dynamo/make_model.py). A cache hit is a
# no-op. Needs a Python >= 3.10 with the `venv` module (PYTHON, default python3) and the package
# registry (PyPI, or PIP_INDEX_URL). Prints nothing but progress on stderr; `dynamo_python` and
# `dynamo_model_dir` in tools/env.sh name what it installed.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh

if [[ -f "$DYNAMO_DIR/.complete" ]]; then
  log "Dynamo $DYNAMO_VERSION up to date: $DYNAMO_DIR"
  exit 0
fi

need_python

# Build into a scratch directory and rename it at the end, so an interrupted install never
# leaves a cache entry that looks complete. A venv records its own path, so the scratch
# directory is the final one, cleared first.
mkdir -p "$(dirname "$DYNAMO_DIR")"
rm -rf "$DYNAMO_DIR"
trap '[[ -f "$DYNAMO_DIR/.complete" ]] || rm -rf "$DYNAMO_DIR"' EXIT
logs="$DYNAMO_DIR/logs"
mkdir -p "$logs"
start=$SECONDS

log "creating a virtual environment with $("$PYTHON" --version 2>&1) ($PYTHON) ..."
"$PYTHON" -m venv "$DYNAMO_DIR/venv" >"$logs/venv.log" 2>&1 ||
  fail_with_log "python -m venv failed: a Python >= 3.10 with the venv module is needed (Debian: apt install python3-venv)" "$logs/venv.log"
pip=("$DYNAMO_DIR/venv/bin/python" -m pip --disable-pip-version-check --no-input)

log "installing ai-dynamo $DYNAMO_VERSION and ai-dynamo-runtime $DYNAMO_VERSION (no dependencies; see tools/dynamo/requirements.txt) ..."
"${pip[@]}" install --no-deps -r dynamo/requirements.txt >"$logs/pip-dynamo.log" 2>&1 ||
  fail_with_log "installing Dynamo from the package registry failed" "$logs/pip-dynamo.log"
log "installing what they import (tools/dynamo/runtime-requirements.txt) ..."
"${pip[@]}" install --no-deps -r dynamo/runtime-requirements.txt >"$logs/pip-runtime.log" 2>&1 ||
  fail_with_log "installing Dynamo's run-time dependencies failed" "$logs/pip-runtime.log"

# The imports the test bed relies on, so a broken install fails here and not in a test.
"$DYNAMO_DIR/venv/bin/python" -c 'import dynamo.frontend.main, dynamo.mocker.main, dynamo._core, dynamo.replay, numpy, prometheus_client, tokenizers' \
  >"$logs/import.log" 2>&1 || fail_with_log "the installed Dynamo does not import" "$logs/import.log"

log "writing the test model directory (tools/dynamo/make_model.py) ..."
"$DYNAMO_DIR/venv/bin/python" dynamo/make_model.py "$DYNAMO_DIR/model" >"$logs/model.log" 2>&1 ||
  fail_with_log "writing the test model failed" "$logs/model.log"

touch "$DYNAMO_DIR/.complete"
log "Dynamo $DYNAMO_VERSION installed in $((SECONDS - start))s: $DYNAMO_DIR ($(du -sh "$DYNAMO_DIR" | cut -f1))"
