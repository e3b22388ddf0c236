#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Builds the local control plane's binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, kwok, helm), Prometheus and promtool (demo, e2e and the chart's alert
# tests), the image writer of `make image` and the release tools (helm-docs for `make docs`,
# actionlint for the GitHub workflows, crane for `make push-image`) from the Go modules under
# tools/, through the Go module proxy, into a cache
# outside the repo keyed by the modules' go.mod/go.sum (and tools/image's source). A cache hit
# is a no-op. Prints nothing but progress on stderr; the bin directory is `tools/env.sh`'s
# TOOLS_BIN.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh

need_go

if [[ -f "$TOOLS_DIR/.complete" ]]; then
  log "tools up to date: $TOOLS_BIN"
  exit 0
fi

# Release server binaries are built the same way: static, no cgo, no local paths. -s -w strips
# symbols (a quarter of the size, and a faster link on two cores).
export CGO_ENABLED=0 GOTOOLCHAIN=local
export GOFLAGS="-trimpath -buildvcs=false -mod=readonly"
NICE=(nice -n "${TOOLS_NICE:-10}")

# Build into a scratch directory and rename it at the end, so an interrupted build never leaves
# a cache entry that looks complete.
mkdir -p "$TOOLS_CACHE"
stage="$(mktemp -d "$TOOLS_CACHE/.build.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin"
# Logs outside the scratch directory, so a failed build's log survives it.
logs="$TOOLS_CACHE/build-logs"
rm -rf "$logs"
mkdir -p "$logs"

# build NAME DIR ARGS...: runs `go build ARGS` in tools/DIR, logging to $logs/NAME.log.
build() {
  local name="$1" dir="$2"
  shift 2
  local logfile="$logs/$name.log" start=$SECONDS
  log "building $name (tools/$dir) ..."
  if ! (cd "$dir" && "${NICE[@]}" go build "$@") >"$logfile" 2>&1; then
    fail_with_log "building $name failed (go build in tools/$dir)" "$logfile"
  fi
  log "built $name in $((SECONDS - start))s"
}

total=$SECONDS
# Download first, so that an unreachable proxy is told apart from a compile error.
log "downloading Go modules (GOPROXY=$(go env GOPROXY)) ..."
for dir in kube etcd kwok helm prometheus image helm-docs actionlint crane; do
  (cd "$dir" && "${NICE[@]}" go mod download) >>"$logs/download.log" 2>&1 ||
    fail_with_log "downloading the Go modules of tools/$dir failed" "$logs/download.log"
done
log "downloaded in $((SECONDS - total))s"
kube_version="$(cd kube && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
kube_minor="$(cut -d. -f2 <<<"$kube_version")"
# Without these the binaries report v0.0.0-master: /version is wrong, and helm's kubeVersion
# checks and kwok's version detection trip over it (hack/lib/version.sh sets the same).
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$kube_minor"
  kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

# One `go build` for the four so they share compiled packages.
build kube kube -ldflags "$kube_ldflags" -o "$stage/bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
# -o names the binary: by default it would be named after the module path (v3).
build etcd etcd -ldflags "-s -w" -o "$stage/bin/etcd" go.etcd.io/etcd/server/v3
build kwok kwok -ldflags "-s -w" -o "$stage/bin/kwok" sigs.k8s.io/kwok/cmd/kwok
# Without it `helm version` says v4.3 (helm's Makefile sets the same).
helm_version="$(cd helm && go list -m -f '{{.Version}}' helm.sh/helm/v4)"
build helm helm -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version" \
  -o "$stage/bin/helm" helm.sh/helm/v4/cmd/helm
# Prometheus as its release is built (.promu.yml: the version ldflags, so that `prometheus
# --version` and its build_info metric tell the real version), but with remove_all_sd: of the
# service-discovery plugins only file and http stay (static_configs need none), a third fewer
# packages to compile. Without builtinassets: the web UI's assets come from an npm build that the
# Go module does not ship, so the UI pages answer 500; the HTTP API (/api/v1/..., /-/ready), which
# the operator, the demo and the tests use, is all there.
prom_module="$(cd prometheus && go list -m -f '{{.Version}}' github.com/prometheus/prometheus)"
prom_version="$(cd prometheus && cat "$(go list -m -f '{{.Dir}}' github.com/prometheus/prometheus)/VERSION")"
prom_ldflags="-s -w"
for kv in "Version=$prom_version" "Revision=$prom_module" Branch=HEAD BuildUser=planner-operator@tools \
  BuildDate=19700101-00:00:00; do
  prom_ldflags+=" -X github.com/prometheus/common/version.$kv"
done
# promtool too, in the same `go build` (they share most packages): `make chart-test` checks the
# chart's alerts with `promtool check rules` and runs their unit tests with `promtool test rules`.
build prometheus prometheus -tags remove_all_sd -ldflags "$prom_ldflags" -o "$stage/bin/" \
  github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool
# The image writer of `make image` (tools/image.sh); its source is part of the cache key.
build image image -ldflags "-s -w" -o "$stage/bin/image" .
# The release tools, with the versions their own release builds stamp in (`--version`).
module_version() { (cd "$1" && go list -m -f '{{.Version}}' "$2"); }
build helm-docs helm-docs \
  -ldflags "-s -w -X main.version=$(module_version helm-docs github.com/norwoodj/helm-docs)" \
  -o "$stage/bin/helm-docs" github.com/norwoodj/helm-docs/cmd/helm-docs
build actionlint actionlint \
  -ldflags "-s -w -X github.com/rhysd/actionlint.version=$(module_version actionlint github.com/rhysd/actionlint)" \
  -o "$stage/bin/actionlint" github.com/rhysd/actionlint/cmd/actionlint
build crane crane \
  -ldflags "-s -w -X github.com/google/go-containerregistry/cmd/crane/cmd.Version=$(module_version crane github.com/google/go-containerregistry)" \
  -o "$stage/bin/crane" github.com/google/go-containerregistry/cmd/crane

# kwok needs Stage definitions (how fake nodes and pods change state). Take upstream's from the
# module source in the module cache; they live in the cache entry, not in the repo.
kwok_src="$(cd kwok && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
mkdir -p "$stage/kwok-stages"
for stage_file in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  src="$kwok_src/kustomize/stage/$stage_file"
  [[ -f "$src" ]] || fail "kwok stage file missing from the module: $src"
  cp "$src" "$stage/kwok-stages/$(basename "$stage_file")"
done
chmod -R u+w "$stage/kwok-stages"

printf '%s\n' "$kube_version" >"$stage/kube-version"
touch "$stage/.complete"
rm -rf "$TOOLS_DIR"
mv "$stage" "$TOOLS_DIR"
trap - EXIT
# Each entry is about 550 MB: keep this one and the one used before it (another branch).
find "$TOOLS_CACHE" -mindepth 1 -maxdepth 1 -type d -regextype posix-extended -regex '.*/[0-9a-f]{16}' \
  -printf '%T@ %p\n' | sort -rn | tail -n +3 | cut -d' ' -f2- | xargs -r rm -rf
log "tools built in $((SECONDS - total))s: $TOOLS_BIN"
