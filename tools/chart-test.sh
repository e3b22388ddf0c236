#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Runs the Helm chart tests that need no cluster (e2e/tests/e2e/chart.rs): helm lint and helm
# template for the default values, each certificate mode and namespace-scoped mode, the rendered
# RBAC against operator/src/rbac.rs, the flags against the objects, the values schema's messages,
# the PrometheusRule's alerts under promtool (check rules, and the unit tests of
# e2e/tests/rules/), NOTES.txt, and the chart README's check (tools/docs.sh). Uses the helm,
# promtool and helm-docs of `make tools` unless HELM, PROMTOOL or HELM_DOCS names another.
# `make e2e` runs them too.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh

if [[ -z "${HELM:-}" ]]; then
  [[ -x "$TOOLS_BIN/helm" ]] || fail "helm is not built for this checkout: run \`make tools\` first, or set HELM"
  export HELM="$TOOLS_BIN/helm"
fi
# The chart's alerts are checked and unit-tested with the promtool of `make tools` unless PROMTOOL
# names another.
if [[ -z "${PROMTOOL:-}" ]]; then
  [[ -x "$TOOLS_BIN/promtool" ]] || fail "promtool is not built for this checkout: run \`make tools\` first, or set PROMTOOL"
  export PROMTOOL="$TOOLS_BIN/promtool"
fi
cd "$TOOLS_SRC/.."
exec "${CARGO:-cargo}" test -p e2e --features e2e --locked --test e2e -- chart:: "$@"
