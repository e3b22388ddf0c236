#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# `make check-workflows` (part of `make check-docs`): actionlint, built by `make tools`
# (ACTIONLINT overrides), on every workflow in .github/workflows/: the YAML against GitHub's
# workflow schema, `${{ }}` expressions and their contexts, the inputs of well-known actions,
# job dependencies and matrices, runner labels, cron syntax. The shell steps go through
# ShellCheck only when ACTIONLINT_SHELLCHECK names its binary, not whenever one is installed, so
# that every machine gives the same answer.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh

REPO="$(cd .. && pwd)"
ACTIONLINT="${ACTIONLINT:-$TOOLS_BIN/actionlint}"
[[ -x "$ACTIONLINT" ]] || fail "actionlint is not built for this checkout: run \`make tools\` first, or set ACTIONLINT"

cd "$REPO"
shopt -s nullglob
workflows=(.github/workflows/*.yml .github/workflows/*.yaml)
((${#workflows[@]} > 0)) || fail "no workflow in .github/workflows/"
if ! "$ACTIONLINT" -shellcheck="${ACTIONLINT_SHELLCHECK:-}" -pyflakes= -no-color "${workflows[@]}"; then
  fail "actionlint found problems in .github/workflows/ (above: file:line:column, what, and the rule); fix the workflow"
fi
log "actionlint: ${workflows[*]} pass"
