#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# `make push-image REGISTRY=<registry>/<path>` (after `make image`): pushes the image tarball to
# <registry>/<path>/planner-operator:<version> with crane (built by `make tools`), no Docker, and
# prints the helm flags that install it by digest.
#
# Environment:
#   REGISTRY           where to push, e.g. ghcr.io/my-org or registry.example.com:5000/team (required)
#   IMAGE_TAG          the tag (default: the operator's version)
#   IMAGE_TARBALL      the tarball (default: what `make image` wrote for this machine,
#                      ${CARGO_TARGET_DIR:-target}/image/planner-operator-<version>.tar)
#   REGISTRY_USERNAME, REGISTRY_PASSWORD
#                      credentials for this push only (kept in a temporary config, removed
#                      afterwards); without them crane uses what `crane auth login`, `docker login`
#                      or `podman login` stored. A registry on localhost or 127.0.0.1 is spoken to
#                      over plain HTTP.
#   CRANE              crane (default: the one `make tools` builds)
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh

REPO="$(cd .. && pwd)"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
[[ "$TARGET_DIR" == /* ]] || TARGET_DIR="$REPO/$TARGET_DIR"
CRANE="${CRANE:-$TOOLS_BIN/crane}"
[[ -x "$CRANE" ]] || fail "crane is not built for this checkout: run \`make tools\` first, or set CRANE"
registry="${REGISTRY:-}"
registry="${registry%/}"
[[ -n "$registry" ]] || fail "REGISTRY is not set: make push-image REGISTRY=<registry>/<path>, e.g. REGISTRY=ghcr.io/my-org"
[[ "$registry" != *://* ]] || fail "REGISTRY=$registry: give the registry and path without a scheme, e.g. ghcr.io/my-org"

if [[ -z "${IMAGE_TAG:-}" || -z "${IMAGE_TARBALL:-}" ]]; then
  pkgid="$(cd "$REPO" && "${CARGO:-cargo}" pkgid --locked -p planner-operator)"
  version="${pkgid##*[#@]}"
fi
tag="${IMAGE_TAG:-$version}"
tarball="${IMAGE_TARBALL:-$TARGET_DIR/image/planner-operator-$version.tar}"
[[ -f "$tarball" ]] || fail "$tarball not found: run \`make image\` first (make push-image does)"
ref="$registry/planner-operator:$tag"

if [[ -n "${REGISTRY_PASSWORD:-}" ]]; then
  [[ -n "${REGISTRY_USERNAME:-}" ]] || fail "REGISTRY_PASSWORD is set but REGISTRY_USERNAME is not"
  DOCKER_CONFIG="$(mktemp -d "${TMPDIR:-/tmp}/planner-operator-push.XXXXXX")"
  export DOCKER_CONFIG
  trap 'rm -rf "$DOCKER_CONFIG"' EXIT
  "$CRANE" auth login "${registry%%/*}" -u "$REGISTRY_USERNAME" --password-stdin <<<"$REGISTRY_PASSWORD" >/dev/null
fi

log "pushing $tarball to $ref"
start=$SECONDS
"$CRANE" push "$tarball" "$ref" >/dev/null
digest="$("$CRANE" digest "$ref")"
log "pushed $ref ($digest) in $((SECONDS - start))s; install it with"
printf '  --set image.repository=%s --set image.digest=%s\n' "$registry/planner-operator" "$digest"
