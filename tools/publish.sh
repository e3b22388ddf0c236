#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Publishes a release folder of `make release` to an OCI registry (the release workflow runs it;
# tools/release-check.sh runs it against a registry on 127.0.0.1):
#   REGISTRY=ghcr.io/<owner> tools/publish.sh DIR
# - each image tarball planner-operator-<version>-linux-<arch>.tar to
#   $REGISTRY/planner-operator:<version>-<arch> (tools/push-image.sh, crane);
# - $REGISTRY/planner-operator:<version>: a multi-platform index of them (crane index append),
#   or, with one platform, that image's tag;
# - the chart package to oci://$REGISTRY/charts/planner-operator:<version> (helm push).
# Credentials: logged in before (crane auth login, helm registry login). A registry on localhost
# or 127.0.0.1 is spoken to over plain HTTP. Prints the image's and the chart's references.
set -euo pipefail
# DIR relative to where the script is called from.
if [[ -n "${1:-}" && -d "$1" ]]; then set -- "$(cd "$1" && pwd)" "${@:2}"; fi
cd "$(dirname "$0")"
source ./env.sh

dir="${1:-}"
[[ -n "$dir" && -d "$dir" ]] || fail "usage: REGISTRY=<registry>/<path> tools/publish.sh DIR (a folder of make release)"
dir="$(cd "$dir" && pwd)"
registry="${REGISTRY:-}"
registry="${registry%/}"
[[ -n "$registry" ]] || fail "REGISTRY is not set, e.g. REGISTRY=ghcr.io/my-org"
CRANE="${CRANE:-$TOOLS_BIN/crane}"
HELM="${HELM:-$TOOLS_BIN/helm}"
for tool in "$CRANE" "$HELM"; do
  [[ -x "$tool" ]] || fail "$tool is not built: run \`make tools\`"
done
version="$(basename "$dir")"
plain_http=()
case "${registry%%/*}" in
  localhost | localhost:* | 127.0.0.1 | 127.0.0.1:*) plain_http=(--plain-http) ;;
esac

shopt -s nullglob
tarballs=("$dir/planner-operator-$version-linux-"*.tar)
((${#tarballs[@]} > 0)) || fail "no image tarball planner-operator-$version-linux-*.tar in $dir"
image="$registry/planner-operator"
manifests=()
for tarball in "${tarballs[@]}"; do
  arch="${tarball##*-linux-}"
  arch="${arch%.tar}"
  IMAGE_TARBALL="$tarball" IMAGE_TAG="$version-$arch" REGISTRY="$registry" bash "$TOOLS_SRC/push-image.sh" >/dev/null
  manifests+=(--manifest "$image:$version-$arch")
done
if ((${#tarballs[@]} > 1)); then
  # Docker media types, as the images crane pushes from docker-archive tarballs have.
  "$CRANE" index append "${manifests[@]}" --tag "$image:$version" --docker-empty-base >/dev/null
else
  "$CRANE" tag "$image:$version-$arch" "$version"
fi
digest="$("$CRANE" digest "$image:$version")"
printf 'image %s:%s@%s (%s)\n' "$image" "$version" "$digest" \
  "$(printf '%s\n' "${tarballs[@]##*-linux-}" | sed 's/\.tar$//; s|^|linux/|' | paste -sd' ')"

"$HELM" push "$dir/planner-operator-$version.tgz" "oci://$registry/charts" "${plain_http[@]}" >&2
printf 'chart oci://%s/charts/planner-operator --version %s\n' "$registry" "$version"
