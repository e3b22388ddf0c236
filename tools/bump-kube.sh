#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Rewrites tools/kube/go.mod for another Kubernetes version: `tools/bump-kube.sh v1.36.4`.
# k8s.io/kubernetes requires each staging module at v0.0.0; every one of them (the list changes
# between minor versions) is replaced with its published tag v0.X.Y. Then `go mod tidy`.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
need_go
cd kube
export GOTOOLCHAIN=local

version="${1:-}"
[[ "$version" =~ ^v1\.[0-9]+\.[0-9]+$ ]] || fail "usage: $0 v1.X.Y (one of: $(go list -m -versions k8s.io/kubernetes | tr ' ' '\n' | tail -3 | tr '\n' ' '))"
staging="v0.${version#v1.}"
gomod="$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')"
[[ -f "$gomod" ]] || fail "could not download k8s.io/kubernetes@$version"

awk '$1 == "replace" {print $2}' go.mod | while read -r module; do
  go mod edit -dropreplace="$module"
done
awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$gomod" | sort -u | while read -r module; do
  go mod edit -replace="$module=$module@$staging"
done
go mod edit -require="k8s.io/kubernetes@$version"
go mod tidy
log "tools/kube now builds Kubernetes $version; run \`make tools\`"
