#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# without-system-packages.sh CMD [ARG]...: runs CMD as on a fresh Debian machine that has only
# rustup, Go, make and a C toolchain: in a private mount namespace where what the build and the
# tests must not need is hidden. .ci/run runs its steps through it, so that CI fails as soon as
# something needs one of them again, even on a machine (a developer's, an old CI image) that has
# them installed. Hidden, where they exist:
#   - protoc (protobuf-compiler) and the well-known .proto files (/usr/include/google,
#     /usr/local/include/google): the operator talks to etcd through its JSON gateway, and no
#     crate may need a protoc at build time;
#   - Prometheus (the Debian package: `prometheus` on PATH, /usr/share/prometheus): the demo and
#     the e2e tests use the one `make tools` builds (tools/prometheus), so a `prometheus` in the
#     tools cache's bin directory stays visible.
# Binaries are covered with /dev/null (executing them fails with "Permission denied") and
# directories with an empty read-only tmpfs; PROTOC, PROTOC_INCLUDE, PROMETHEUS and
# PROMETHEUS_BIN are unset. Nothing outside the namespace changes. Needs root, or unprivileged
# user namespaces: then the command runs with the caller's uid and gid in user namespaces of its
# own, where files of other users show as owned by nobody.
#
# openssl and curl are not hidden: tools/cluster-up.sh makes the local cluster's certificates
# with openssl and probes health endpoints with curl (over TLS with client certificates), and the
# demo waits on curl; both come with a stock Debian install (curl is how rustup is installed).
#
# Exit status: CMD's; 125 when the namespace cannot be set up.
set -euo pipefail

if [[ $# -eq 0 || "$1" == -h || "$1" == --help ]]; then
  sed -n '3,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  [[ $# -eq 0 ]] && exit 2
  exit 0
fi

TOOLS_SRC_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ "${_WITHOUT_SYSTEM_PACKAGES_INSIDE:-}" != 1 ]]; then
  command -v unshare >/dev/null 2>&1 || {
    echo "without-system-packages: unshare (util-linux) not found" >&2
    exit 125
  }
  export _WITHOUT_SYSTEM_PACKAGES_INSIDE=1
  if [[ "$(id -u)" == 0 ]]; then
    exec unshare --mount --propagation private -- bash "$TOOLS_SRC_DIR/without-system-packages.sh" "$@"
  fi
  # Not root: root of a user namespace of its own for the mounts, then back to this uid and gid
  # in a nested one (set below) for the command.
  export _WITHOUT_SYSTEM_PACKAGES_IDS="$(id -u):$(id -g)"
  exec unshare --user --map-root-user --mount --propagation private -- \
    bash "$TOOLS_SRC_DIR/without-system-packages.sh" "$@"
fi
unset _WITHOUT_SYSTEM_PACKAGES_INSIDE
as_caller=()
if [[ -n "${_WITHOUT_SYSTEM_PACKAGES_IDS:-}" ]]; then
  as_caller=(unshare --user --map-user="${_WITHOUT_SYSTEM_PACKAGES_IDS%:*}" --map-group="${_WITHOUT_SYSTEM_PACKAGES_IDS#*:}" --)
  unset _WITHOUT_SYSTEM_PACKAGES_IDS
fi

# TOOLS_BIN: its prometheus is the one that must stay.
# shellcheck source=env.sh
source "$TOOLS_SRC_DIR/env.sh"

die() {
  printf 'without-system-packages: %s\n' "$*" >&2
  exit 125
}

declare -A hidden=()
hide_file() {
  local real
  real="$(realpath -e -- "$1" 2>/dev/null)" || return 0
  [[ -f "$real" && -z "${hidden[$real]:-}" ]] || return 0
  mount --bind /dev/null "$real" || die "cannot hide $real (mount --bind /dev/null)"
  hidden[$real]=1
  printf 'without-system-packages: hid %s\n' "$1" >&2
}
hide_dir() {
  local real
  real="$(realpath -e -- "$1" 2>/dev/null)" || return 0
  [[ -d "$real" && -z "${hidden[$real]:-}" ]] || return 0
  mount -t tmpfs -o ro,nosuid,nodev,noexec,size=4k,mode=0755 without-system-packages "$real" ||
    die "cannot hide $real (mount -t tmpfs)"
  hidden[$real]=1
  printf 'without-system-packages: hid %s/\n' "$1" >&2
}

tools_bin_real="$(realpath -m -- "$TOOLS_BIN")"
IFS=: read -ra path_dirs <<<"$PATH"
for dir in "${path_dirs[@]}" /usr/local/bin /usr/bin /bin /usr/local/sbin /usr/sbin /sbin; do
  [[ -n "$dir" && -d "$dir" ]] || continue
  # Every protoc, also versioned names some packages install (protoc-3.21.12 and the like).
  for f in "$dir"/protoc "$dir"/protoc-[0-9]*; do
    [[ -e "$f" ]] && hide_file "$f"
  done
  # Not the tools cache's (nor a link to it, such as tools/e2e.sh's PATH directory).
  if [[ -e "$dir/prometheus" && "$(dirname -- "$(realpath -m -- "$dir/prometheus")")" != "$tools_bin_real" ]]; then
    hide_file "$dir/prometheus"
  fi
done
for dir in /usr/include/google /usr/local/include/google /usr/share/prometheus; do
  hide_dir "$dir"
done
unset PROTOC PROTOC_INCLUDE PROMETHEUS PROMETHEUS_BIN

exec "${as_caller[@]}" "$@"
