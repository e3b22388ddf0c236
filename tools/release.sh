#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# `make release` (after `make image`): everything a release publishes, in one folder,
#   ${CARGO_TARGET_DIR:-target}/release-artifacts/<version>/
#     planner-operator-<version>-linux-<arch>.tar  the image of each platform (docker-archive:
#                                                   docker load -i, crane push FILE REF)
#     planner-operator-<version>.tgz               the Helm chart (helm package; helm install it,
#                                                   or helm push it to an OCI registry)
#     planner-operator-crds-<version>.yaml         the PlannerPolicy and GpuBudget CRDs (the
#                                                   chart's crds/, for kubectl apply --server-side
#                                                   on upgrades, which Helm never does)
#     dynamographdeployment-crd-<version>.yaml     this operator's DGD CRD, for the full operator
#                                                   on a cluster without NVIDIA's Dynamo operator
#                                                   only (where NVIDIA's runs, it owns that CRD)
#     SHA256SUMS                                   sha256sum -c SHA256SUMS
# then checks the folder (tools/release-check.sh). The version is the operator's Cargo version,
# which the chart's version and appVersion must equal.
#
# Environment (all optional):
#   RELEASE_PLATFORMS  platforms of the images (default: linux/amd64). linux/amd64 is the tarball
#                      `make image` wrote (hard-linked, not rebuilt); another platform is built by
#                      IMAGE_ARCH=<arch> tools/image.sh (cross-built on another machine: see there)
#   RELEASE_DIR        the folder (default above); emptied first
#   CARGO              cargo (default: cargo)
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh

REPO="$(cd .. && pwd)"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
[[ "$TARGET_DIR" == /* ]] || TARGET_DIR="$REPO/$TARGET_DIR"
CARGO="${CARGO:-cargo}"
HELM="${HELM:-$TOOLS_BIN/helm}"
CHART="$REPO/charts/planner-operator"
read -ra platforms <<<"${RELEASE_PLATFORMS:-linux/amd64}"
start=$SECONDS

[[ -x "$HELM" ]] || fail "helm is not built for this checkout: run \`make tools\` first, or set HELM"

pkgid="$(cd "$REPO" && "$CARGO" pkgid --locked -p planner-operator)"
version="${pkgid##*[#@]}"
chart_field() { sed -n "s/^$1: *\"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" "$CHART/Chart.yaml"; }
chart_version="$(chart_field version)"
app_version="$(chart_field appVersion)"
[[ "$chart_version" == "$version" && "$app_version" == "$version" ]] ||
  fail "the operator is $version but charts/planner-operator/Chart.yaml has version $chart_version, appVersion $app_version: set both to $version"

out="${RELEASE_DIR:-$TARGET_DIR/release-artifacts/$version}"
rm -rf "$out"
mkdir -p "$out"
log "release $version: $out"

# --- Images --------------------------------------------------------------------------------------
case "$(uname -m)" in
  x86_64) host_arch=amd64 ;;
  aarch64 | arm64) host_arch=arm64 ;;
  *) fail "unsupported machine $(uname -m)" ;;
esac
for platform in "${platforms[@]}"; do
  case "$platform" in
    linux/amd64 | linux/arm64) arch="${platform#linux/}" ;;
    *) fail "RELEASE_PLATFORMS: $platform is not linux/amd64 or linux/arm64" ;;
  esac
  if [[ "$arch" == "$host_arch" ]]; then
    built="$TARGET_DIR/image/planner-operator-$version.tar"
    [[ -f "$built" ]] || fail "$built not found: run \`make image\` first (make release does)"
  else
    log "building the $platform image (IMAGE_ARCH=$arch tools/image.sh)"
    IMAGE_ARCH="$arch" CARGO="$CARGO" bash "$TOOLS_SRC/image.sh"
    built="$TARGET_DIR/image/planner-operator-$version-linux-$arch.tar"
  fi
  ln -f "$built" "$out/planner-operator-$version-linux-$arch.tar" 2>/dev/null ||
    cp "$built" "$out/planner-operator-$version-linux-$arch.tar"
done

# --- Chart and CRDs ------------------------------------------------------------------------------
"$HELM" package "$CHART" --destination "$out" >/dev/null
# The CRDs as the chart ships them (check-manifests keeps them equal to the Rust types; the
# check compares them with the release binary's `planner-operator crd`).
{
  first=1
  for crd in "$CHART"/crds/*.yaml; do
    ((first)) || printf -- '---\n'
    first=0
    cat "$crd"
  done
} >"$out/planner-operator-crds-$version.yaml"
cp "$CHART/files/crds/dynamographdeployments.nvidia.com.yaml" "$out/dynamographdeployment-crd-$version.yaml"

# --- Checksums -----------------------------------------------------------------------------------
sums="$(cd "$out" && find . -maxdepth 1 -type f -printf '%f\n' | LC_ALL=C sort | xargs sha256sum)"
printf '%s\n' "$sums" >"$out/SHA256SUMS"

not_built=()
for platform in linux/amd64 linux/arm64; do
  [[ " ${platforms[*]} " == *" $platform "* ]] || not_built+=("$platform")
done
log "wrote $out in $((SECONDS - start))s:"
find "$out" -maxdepth 1 -type f -printf '  %10s  %f\n' | LC_ALL=C sort -k2 >&2
if ((${#not_built[@]} > 0)); then
  log "not built: ${not_built[*]} image (RELEASE_PLATFORMS=\"${platforms[*]} ${not_built[*]}\" builds it; see tools/image.sh)"
fi

bash "$TOOLS_SRC/release-check.sh" "$out"
