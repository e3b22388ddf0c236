#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Checks a release folder of `make release` (tools/release.sh runs it at the end):
#   tools/release-check.sh DIR
# - it holds exactly the expected files for its version (the image of each RELEASE_PLATFORMS
#   platform, the chart package, the two CRD files, SHA256SUMS), and `sha256sum -c SHA256SUMS`
#   passes for every one of them;
# - the chart package is the chart of that version and appVersion, carries its generated README
#   (not the template), its CRDs and schema, passes `helm lint --strict`, and installs planner
#   only by default (`--dgd-controller=false`) and the full operator with
#   `dgdController.enabled=true`;
# - the CRD files are, document for document, what the release binary's `planner-operator crd`
#   prints (the DGD CRD apart from the others);
# - each image tarball is valid (digests), of its platform and tagged <repository>:<version>;
# - tools/publish.sh (what the release workflow runs) publishes the folder to a registry on
#   127.0.0.1 (crane's, in memory): each image reads back with its tarball's digest, the
#   version's tag resolves to each platform's image, `helm show chart oci://...` reads the chart
#   back; and `make push-image` prints the helm flags of what it pushed.
# Then, so that a check that cannot fail does not pass unnoticed, it damages copies of the folder
# (a changed byte in the chart, a missing CRD file, an extra file) and fails unless each is caught.
# The version is read from the folder's name; RELEASE_PLATFORMS as for tools/release.sh.
set -euo pipefail
# DIR relative to where the script is called from.
if [[ -n "${1:-}" && -d "$1" ]]; then set -- "$(cd "$1" && pwd)" "${@:2}"; fi
cd "$(dirname "$0")"
source ./env.sh

dir="${1:-}"
[[ -n "$dir" && -d "$dir" ]] || fail "usage: tools/release-check.sh DIR (a folder of make release)"
dir="$(cd "$dir" && pwd)"
REPO="$(cd .. && pwd)"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
[[ "$TARGET_DIR" == /* ]] || TARGET_DIR="$REPO/$TARGET_DIR"
HELM="${HELM:-$TOOLS_BIN/helm}"
IMAGE_TOOL="$TOOLS_BIN/image"
CRANE="${CRANE:-$TOOLS_BIN/crane}"
IMAGE_REPOSITORY="${IMAGE_REPOSITORY:-ghcr.io/planner-operator/planner-operator}"
read -ra platforms <<<"${RELEASE_PLATFORMS:-linux/amd64}"
version="$(basename "$dir")"
for tool in "$HELM" "$IMAGE_TOOL" "$CRANE"; do
  [[ -x "$tool" ]] || fail "$tool is not built: run \`make tools\`"
done
work="$(mktemp -d "${TMPDIR:-/tmp}/planner-operator-release-check.XXXXXX")"
registry_pid=""
cleanup() {
  [[ -z "$registry_pid" ]] || kill "$registry_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# check_folder DIR: the checks that need nothing but the folder; prints what is wrong, fails then.
check_folder() {
  local d="$1" problems=()
  local -a expected=("planner-operator-$version.tgz" "planner-operator-crds-$version.yaml"
    "dynamographdeployment-crd-$version.yaml" SHA256SUMS)
  local platform
  for platform in "${platforms[@]}"; do
    expected+=("planner-operator-$version-linux-${platform#linux/}.tar")
  done
  local have want
  have="$(cd "$d" && find . -mindepth 1 -maxdepth 1 -printf '%f\n' | LC_ALL=C sort)"
  want="$(printf '%s\n' "${expected[@]}" | LC_ALL=C sort)"
  if [[ "$have" != "$want" ]]; then
    problems+=("the folder holds [$(tr '\n' ' ' <<<"$have")], expected [$(tr '\n' ' ' <<<"$want")]")
  fi
  if [[ -f "$d/SHA256SUMS" ]]; then
    local listed
    listed="$(awk '{ sub(/^\*/, "", $2); print $2 }' "$d/SHA256SUMS" | LC_ALL=C sort)"
    [[ "$listed" == "$(grep -vx SHA256SUMS <<<"$want")" ]] ||
      problems+=("SHA256SUMS lists [$(tr '\n' ' ' <<<"$listed")], not every file but itself")
    local sums
    if ! sums="$(cd "$d" && sha256sum --strict -c SHA256SUMS 2>&1)"; then
      problems+=("sha256sum -c SHA256SUMS: $(grep -v ': OK$' <<<"$sums" | tr '\n' ';')")
    fi
  fi
  if ((${#problems[@]} > 0)); then
    printf '  %s\n' "${problems[@]}" >&2
    return 1
  fi
}

log "checking $dir"
check_folder "$dir" || fail "release folder $dir is not what make release writes"

# --- The chart -----------------------------------------------------------------------------------
chart_tgz="$dir/planner-operator-$version.tgz"
"$HELM" show chart "$chart_tgz" >"$work/Chart.yaml"
grep -qx "version: $version" "$work/Chart.yaml" || fail "the chart package is not version $version"
grep -Eqx "appVersion: \"?$version\"?" "$work/Chart.yaml" || fail "the chart package's appVersion is not $version"
files="$(tar -tzf "$chart_tgz")"
for want in planner-operator/README.md planner-operator/values.schema.json \
  planner-operator/crds/plannerpolicies.planner.dynamo.io.yaml planner-operator/crds/gpubudgets.planner.dynamo.io.yaml \
  planner-operator/files/crds/dynamographdeployments.nvidia.com.yaml planner-operator/templates/NOTES.txt; do
  grep -qx "$want" <<<"$files" || fail "the chart package lacks $want"
done
! grep -q 'README.md.gotmpl$' <<<"$files" || fail "the chart package carries README.md.gotmpl (.helmignore)"
cmp -s <(tar -xzOf "$chart_tgz" planner-operator/README.md) "$REPO/charts/planner-operator/README.md" ||
  fail "the chart package's README.md is not charts/planner-operator/README.md"
"$HELM" lint --strict "$chart_tgz" >"$work/lint.log" 2>&1 || fail_with_log "helm lint --strict of the chart package failed" "$work/lint.log"
"$HELM" template po "$chart_tgz" --namespace ops >"$work/default.yaml"
grep -q -- '--dgd-controller=false' "$work/default.yaml" || fail "the chart package does not install planner only by default"
"$HELM" template po "$chart_tgz" --namespace ops --set dgdController.enabled=true --set dgdCrd.install=true >"$work/full.yaml"
grep -q -- '--dgd-controller=true' "$work/full.yaml" || fail "dgdController.enabled=true does not run the DGD controller"
grep -q 'name: dynamographdeployments.nvidia.com' "$work/full.yaml" || fail "dgdCrd.install=true renders no DGD CRD"

# --- The CRDs ------------------------------------------------------------------------------------
# split_documents FILE DIR: one file per YAML document of FILE, named by its sha256 (trailing
# newlines cut); prints the sorted names.
split_documents() {
  mkdir -p "$2"
  awk -v dir="$2" 'BEGIN { n = 0; f = dir "/0" } /^---$/ { n++; f = dir "/" n; next } { print > f }' "$1"
  local doc
  for doc in "$2"/*; do
    printf '%s\n' "$(<"$doc")" | sha256sum | cut -d' ' -f1
  done | LC_ALL=C sort
}
bin="$TARGET_DIR/release/planner-operator"
[[ -x "$bin" ]] || fail "$bin not found: make release runs make image first"
"$bin" crd >"$work/crd.yaml"
cat "$dir/planner-operator-crds-$version.yaml" >"$work/released.yaml"
printf -- '---\n' >>"$work/released.yaml"
cat "$dir/dynamographdeployment-crd-$version.yaml" >>"$work/released.yaml"
[[ "$(split_documents "$work/crd.yaml" "$work/crd")" == "$(split_documents "$work/released.yaml" "$work/released")" ]] ||
  fail "the release's CRD files are not what \`planner-operator crd\` of the release binary prints"
grep -q '^  name: dynamographdeployments.nvidia.com$' "$dir/dynamographdeployment-crd-$version.yaml" ||
  fail "dynamographdeployment-crd-$version.yaml is not the DGD CRD"
! grep -q '^  name: dynamographdeployments.nvidia.com$' "$dir/planner-operator-crds-$version.yaml" ||
  fail "planner-operator-crds-$version.yaml carries the DGD CRD, which NVIDIA's operator owns where it runs"

# --- The images ----------------------------------------------------------------------------------
# A registry on a loopback port (crane's, in memory) to push each image to and read it back.
port="$(bash -c 'for p in $(shuf -i 20000-40000 -n 20); do (echo >/dev/tcp/127.0.0.1/$p) 2>/dev/null || { echo $p; exit; }; done')"
[[ -n "$port" ]] || fail "no free loopback port for the test registry"
"$CRANE" registry serve --address "127.0.0.1:$port" >"$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 50); do
  curl -sf "http://127.0.0.1:$port/v2/" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$port/v2/" >/dev/null || fail_with_log "crane registry serve did not start" "$work/registry.log"
for platform in "${platforms[@]}"; do
  tarball="$dir/planner-operator-$version-linux-${platform#linux/}.tar"
  "$IMAGE_TOOL" check "$tarball" >/dev/null || fail "$tarball is not a valid image"
  [[ "$("$IMAGE_TOOL" config "$tarball" platform)" == "$platform" ]] || fail "$tarball is not a $platform image"
  tags="$(tar -xOf "$tarball" manifest.json)"
  [[ "$tags" == *"\"$IMAGE_REPOSITORY:$version\""* ]] || fail "$tarball is not tagged $IMAGE_REPOSITORY:$version: $tags"
done
# What the release workflow does with the folder (tools/publish.sh), against that registry.
registry="127.0.0.1:$port/check"
REGISTRY="$registry" bash "$TOOLS_SRC/publish.sh" "$dir" >"$work/publish.log" 2>&1 ||
  fail_with_log "tools/publish.sh failed" "$work/publish.log"
for platform in "${platforms[@]}"; do
  arch="${platform#linux/}"
  tarball="$dir/planner-operator-$version-linux-$arch.tar"
  digest="$("$IMAGE_TOOL" check "$tarball" | grep -o 'sha256:[0-9a-f]\{64\}' | head -n1)"
  [[ -n "$digest" ]] || fail "image check printed no digest for $tarball"
  pushed="$("$CRANE" digest "$registry/planner-operator:$version-$arch")"
  [[ "$pushed" == "$digest" ]] || fail "pushed $tarball reads back as $pushed, not $digest"
  log "  $platform image $digest pushed and read back by digest"
done
# The version's tag: the index of every platform (or the one image), and what each resolves to.
for platform in "${platforms[@]}"; do
  resolved="$("$CRANE" digest --platform "$platform" "$registry/planner-operator:$version")"
  [[ "$resolved" == "$("$CRANE" digest "$registry/planner-operator:$version-${platform#linux/}")" ]] ||
    fail "$registry/planner-operator:$version for $platform is not the $platform image"
done
grep -q "^image $registry/planner-operator:$version@sha256:" "$work/publish.log" ||
  fail_with_log "publish.sh did not print the image reference" "$work/publish.log"
"$HELM" show chart "oci://$registry/charts/planner-operator" --version "$version" --plain-http >"$work/pushed-chart.yaml" 2>&1 ||
  fail_with_log "the pushed chart cannot be read back (helm show chart oci://...)" "$work/pushed-chart.yaml"
grep -qx "version: $version" "$work/pushed-chart.yaml" || fail "the pushed chart is not version $version"
# make push-image's own output: the helm flags of what it pushed.
IMAGE_TARBALL="$dir/planner-operator-$version-linux-${platforms[0]#linux/}.tar" REGISTRY="$registry/push" \
  bash "$TOOLS_SRC/push-image.sh" >"$work/push.log" 2>&1 || fail_with_log "push-image.sh failed" "$work/push.log"
grep -q -- "--set image.repository=$registry/push/planner-operator --set image.digest=sha256:" "$work/push.log" ||
  fail_with_log "push-image.sh did not print the helm flags of what it pushed" "$work/push.log"
log "  published to $registry: the images, $version as their index, the chart (helm show chart reads it back)"

# --- The checks catch damage ---------------------------------------------------------------------
# copy_folder: a copy of the folder in $work/copy (image tarballs linked, not copied).
copy_folder() {
  rm -rf "$work/copy"
  mkdir -p "$work/copy"
  local f
  for f in "$dir"/*; do
    if [[ "$f" == *.tar ]]; then ln -s "$f" "$work/copy/"; else cp "$f" "$work/copy/"; fi
  done
}
expect_caught() {
  if check_folder "$work/copy" 2>"$work/caught.log"; then
    fail "the check missed: $1"
  fi
}
copy_folder
check_folder "$work/copy" || fail "the check fails on an intact copy of the folder"
printf 'x' | dd of="$work/copy/planner-operator-$version.tgz" bs=1 seek=100 conv=notrunc status=none
expect_caught "a changed byte in the chart package"
copy_folder
rm "$work/copy/dynamographdeployment-crd-$version.yaml"
expect_caught "a missing CRD file"
copy_folder
: >"$work/copy/extra.txt"
expect_caught "a file that is not part of the release"
log "release $version checked: files, checksums, chart, CRDs, images (and the checks catch a changed byte, a missing and an extra file)"
