#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# The generated documentation: `make docs` writes it, `make check-docs` fails when a committed
# copy differs from what would be written.
#
#   tools/docs.sh generate [CHART_DIR]  write CHART_DIR/README.md
#   tools/docs.sh check [CHART_DIR]     exit 1, naming the file and the fix, when it is stale
#
# CHART_DIR defaults to charts/planner-operator. Its README.md is rendered by helm-docs (built by
# `make tools`; HELM_DOCS overrides) from the chart's README.md.gotmpl, Chart.yaml and the
# `# --` comments of values.yaml, values in the order of the file.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh

REPO="$(cd .. && pwd)"
mode="${1:-}"
chart="${2:-$REPO/charts/planner-operator}"
[[ "$mode" == generate || "$mode" == check ]] || fail "usage: tools/docs.sh generate|check [CHART_DIR]"
[[ -f "$chart/Chart.yaml" && -f "$chart/README.md.gotmpl" ]] ||
  fail "$chart is not a chart with a README.md.gotmpl"
chart="$(cd "$chart" && pwd)"

HELM_DOCS="${HELM_DOCS:-$TOOLS_BIN/helm-docs}"
[[ -x "$HELM_DOCS" ]] || fail "helm-docs is not built for this checkout: run \`make tools\` first, or set HELM_DOCS"

# render: the README helm-docs writes for the chart, on stdout.
render() {
  "$HELM_DOCS" --chart-search-root "$chart" --template-files README.md.gotmpl \
    --sort-values-order file --skip-version-footer --log-level warning --dry-run
}

# Shown paths are relative to the repository when the chart is in it.
shown="${chart#"$REPO"/}/README.md"
case "$mode" in
  generate)
    out="$(mktemp "$chart/.README.md.XXXXXX")"
    trap 'rm -f "$out"' EXIT
    render >"$out"
    mv "$out" "$chart/README.md"
    trap - EXIT
    log "wrote $shown"
    ;;
  check)
    expected="$(mktemp "${TMPDIR:-/tmp}/planner-operator-docs.XXXXXX")"
    trap 'rm -f "$expected"' EXIT
    render >"$expected"
    if [[ ! -f "$chart/README.md" ]]; then
      fail "$shown is missing: run \`make docs\` (helm-docs writes it from values.yaml and README.md.gotmpl) and commit it"
    fi
    if ! diff -u --label "$shown (committed)" --label "$shown (generated)" "$chart/README.md" "$expected" >"$expected.diff"; then
      head -n 40 "$expected.diff" >&2
      rm -f "$expected.diff"
      fail "stale: $shown differs from what helm-docs generates from the chart's values.yaml and README.md.gotmpl; run \`make docs\` and commit it (edit values.yaml's \`# --\` comments or README.md.gotmpl, never README.md)"
    fi
    rm -f "$expected.diff"
    log "up to date: $shown"
    ;;
esac
