#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# `make image`: the release image of planner-operator, built and checked without a container
# runtime. Builds the release binary, assembles a distroless-like root filesystem (the binary,
# the shared libraries ldd lists at the same paths, the dynamic loader, /etc/passwd and
# /etc/group with root and nonroot 65532, /etc/nsswitch.conf, the CA bundle, /tmp, the nonroot
# home), and writes it as a one-layer image with the Dockerfile's entrypoint, command, user and
# ports (tools/image, built by `make tools`) to
#   ${CARGO_TARGET_DIR:-target}/image/planner-operator-<version>.tar
# a docker-archive tarball (`docker load -i`, `podman load -i`, `crane push FILE REF`). Then
# checks the artifact as a runtime would see it: validates the tarball's digests, extracts the
# image's layers into a fresh directory and runs the config's entrypoint there (new mount and PID
# namespaces, chroot, /proc and /dev/{null,zero,random,urandom}, the image's environment, working
# directory and user) with `--help` and with `version`; fails if either fails. Prints the image
# digest and sizes.
#
# Environment (all optional):
#   IMAGE_ARCH        amd64 or arm64 (default: this machine's). Another machine's is cross-built:
#                     `rustup target add` of its Rust target, Debian's cross C toolchain and libc
#                     (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross) for the binary and the image's
#                     libraries, and qemu-user-static to run the check; the tarball is then
#                       ${CARGO_TARGET_DIR:-target}/image/planner-operator-<version>-linux-<arch>.tar
#   IMAGE_REPOSITORY  repository of the tag recorded in the tarball
#                     (ghcr.io/planner-operator/planner-operator, as the chart's image.repository)
#   SOURCE_DATE_EPOCH creation time of the image and its files (default: the HEAD commit's time),
#                     so that the same commit gives the same image digest
#   CARGO             cargo (default: cargo)
#
# The running check needs root (or unprivileged user namespaces: it then runs as root in a user
# namespace instead of as 65532).
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
# The root filesystem's directories and files get their modes from it: readable by 65532.
umask 022

REPO="$(cd .. && pwd)"
TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
[[ "$TARGET_DIR" == /* ]] || TARGET_DIR="$REPO/$TARGET_DIR"
IMAGE_REPOSITORY="${IMAGE_REPOSITORY:-ghcr.io/planner-operator/planner-operator}"
CARGO="${CARGO:-cargo}"
NONROOT=65532
start=$SECONDS

for cmd in ldd tar unshare "$CARGO" git; do
  command -v "$cmd" >/dev/null 2>&1 || fail "$cmd not found on PATH: make image needs it"
done

case "$(uname -m)" in
  x86_64) host_arch=amd64 ;;
  aarch64 | arm64) host_arch=arm64 ;;
  *) fail "unsupported machine $(uname -m) for the image's platform" ;;
esac
arch="${IMAGE_ARCH:-$host_arch}"
case "$arch" in
  amd64) rust_target=x86_64-unknown-linux-gnu gnu=x86_64-linux-gnu ;;
  arm64) rust_target=aarch64-unknown-linux-gnu gnu=aarch64-linux-gnu ;;
  *) fail "IMAGE_ARCH=$arch: amd64 or arm64" ;;
esac
cross=""
cargo_target=()
if [[ "$arch" != "$host_arch" ]]; then
  # Cross-building: the Rust target's standard library, and a C cross compiler and libc for the
  # crates with C code (ring, zstd) and for the link; the image gets that libc's libraries.
  cross="$gnu"
  sysroot="/usr/$gnu"
  qemu="qemu-$([[ "$arch" == arm64 ]] && echo aarch64 || echo x86_64)-static"
  for cmd in "$gnu-gcc" "$gnu-readelf" "$qemu"; do
    command -v "$cmd" >/dev/null 2>&1 ||
      fail "$cmd not found: cross-building the $arch image needs Debian's gcc-$gnu, libc6-dev-${arch}-cross and qemu-user-static (apt-get install gcc-${gnu//_/-} libc6-dev-${arch}-cross qemu-user-static)"
  done
  [[ -d "$sysroot/lib" ]] || fail "$sysroot/lib not found: apt-get install libc6-dev-${arch}-cross"
  if ! rustc --print target-libdir --target "$rust_target" 2>/dev/null | xargs -r test -d; then
    fail "the Rust standard library for $rust_target is not installed: rustup target add $rust_target"
  fi
  target_env="$(tr 'a-z-' 'A-Z_' <<<"$rust_target")"
  export "CARGO_TARGET_${target_env}_LINKER=$gnu-gcc" "CC_${rust_target//-/_}=$gnu-gcc" "AR_${rust_target//-/_}=$gnu-ar"
  cargo_target=(--target "$rust_target")
fi

# The image writer (tools/image) comes with the other tools; a no-op once cached.
bash ./build.sh
IMAGE_TOOL="$TOOLS_BIN/image"
[[ -x "$IMAGE_TOOL" ]] || fail "$IMAGE_TOOL was not built (make tools)"

# --- The release binary --------------------------------------------------------------------------
log "building the release binary (cargo build --release -p planner-operator ${cargo_target[*]})"
build_start=$SECONDS
(cd "$REPO" && "$CARGO" build --release --locked -p planner-operator --bin planner-operator "${cargo_target[@]}")
build_seconds=$((SECONDS - build_start))
BIN="$TARGET_DIR/${cross:+$rust_target/}release/planner-operator"
[[ -x "$BIN" ]] || fail "$BIN was not built"

# The version Cargo gives the package: path+file:///...#planner-operator@0.1.0 or ...#0.1.0.
pkgid="$(cd "$REPO" && "$CARGO" pkgid --locked -p planner-operator)"
version="${pkgid##*[#@]}"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]+)?$ ]] || fail "cannot read the version from \`cargo pkgid\`: $pkgid"
revision="$(git -C "$REPO" rev-parse HEAD)"
if [[ -n "$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
  log "warning: the working tree has uncommitted changes; the image's revision label says $revision"
fi
epoch="${SOURCE_DATE_EPOCH:-$(git -C "$REPO" log -1 --format=%ct)}"
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
description="$(sed -n 's/^description *= *"\(.*\)"$/\1/p' "$REPO/operator/Cargo.toml")"

# --- Root filesystem -----------------------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/planner-operator-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
mkdir -p "$rootfs"
install -D -m 0755 "$BIN" "$rootfs/usr/local/bin/planner-operator"

# Shared libraries and the loader, at the paths ldd resolves them to (the loader's default
# search path finds them there, as on the build machine), as regular files. Cross-built: the
# libraries the binary needs (readelf), from the cross libc, at Debian's multiarch paths for the
# image's architecture (/lib/<triple>/, the loader at the path the binary names), where that
# architecture's loader looks.
if [[ -n "$cross" ]]; then
  interp="$("$gnu-readelf" -l "$BIN" | sed -n 's/.*\[Requesting program interpreter: \(.*\)\]/\1/p')"
  [[ -n "$interp" ]] || fail "$BIN names no program interpreter (readelf -l)"
  [[ -f "$sysroot/lib/$(basename "$interp")" ]] || fail "$sysroot/lib/$(basename "$interp") (the loader $BIN names) not found"
  install -D -m 0755 "$sysroot/lib/$(basename "$interp")" "$rootfs$interp"
  while IFS= read -r needed; do
    [[ -f "$sysroot/lib/$needed" ]] || fail "$needed (needed by $BIN) is not in $sysroot/lib"
    install -D -m 0755 "$(readlink -f "$sysroot/lib/$needed")" "$rootfs/lib/$gnu/$needed"
  done < <("$gnu-readelf" -d "$BIN" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  libs=""
elif ldd_out="$(ldd "$BIN" 2>&1)"; then
  libs="$(awk '$2 == "=>" && $3 == "not" { print "missing " $1; next }
    $2 == "=>" && $3 ~ /^\// { print $3; next }
    $1 ~ /^\// { print $1 }' <<<"$ldd_out")"
  if grep -q '^missing ' <<<"$libs"; then
    fail "ldd cannot find shared libraries of $BIN: $(grep '^missing ' <<<"$libs" | cut -d' ' -f2 | tr '\n' ' ')"
  fi
elif grep -q 'not a dynamic executable' <<<"$ldd_out"; then
  libs="" # static: nothing to add
else
  fail "ldd $BIN failed: $ldd_out"
fi
while IFS= read -r lib; do
  [[ -n "$lib" ]] || continue
  [[ -f "$lib" ]] || fail "shared library $lib (from ldd) is not a file"
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
  chmod 0755 "$rootfs$lib"
done <<<"$libs"

# Users and groups as distroless has them: root, and nonroot (65532), the image's user, whose
# home is the working directory.
mkdir -p "$rootfs/etc" "$rootfs/root" "$rootfs/home/nonroot" "$rootfs/tmp"
chmod 0700 "$rootfs/root" "$rootfs/home/nonroot"
chmod 1777 "$rootfs/tmp"
cat >"$rootfs/etc/passwd" <<EOF
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:$NONROOT:$NONROOT:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<EOF
root:x:0:
nonroot:x:$NONROOT:
EOF
# Name lookups (glibc's getaddrinfo, which the Kubernetes and HTTP clients' DNS resolution goes
# through): the pod's /etc/hosts first, then DNS from the /etc/resolv.conf the kubelet mounts.
cat >"$rootfs/etc/nsswitch.conf" <<EOF
passwd: files
group: files
hosts: files dns
EOF
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group" "$rootfs/etc/nsswitch.conf"
# The Kubernetes client trusts the cluster's CA alone (kubeconfig or the ServiceAccount's
# ca.crt), but the Prometheus and etcd-gateway clients (reqwest, rustls-platform-verifier) verify
# https:// URLs against the system roots, which they find at SSL_CERT_FILE (the image's Env). The
# distroless base of the Dockerfile has the same Debian bundle.
ca_bundle=/etc/ssl/certs/ca-certificates.crt
if [[ -s "$ca_bundle" ]]; then
  install -D -m 0644 "$ca_bundle" "$rootfs$ca_bundle"
else
  log "warning: $ca_bundle not found (Debian's ca-certificates): the image gets no CA bundle, so https:// Prometheus URLs with a public CA will not verify"
fi

# --- The image -----------------------------------------------------------------------------------
out_dir="$TARGET_DIR/image"
out="$out_dir/planner-operator-$version${cross:+-linux-$arch}.tar"
mkdir -p "$out_dir"
log "writing $out"
"$IMAGE_TOOL" build --rootfs "$rootfs" --out "$out" --tag "$IMAGE_REPOSITORY:$version" \
  --created "$created" --arch "$arch" --owner "home/nonroot=$NONROOT:$NONROOT" \
  --label "org.opencontainers.image.title=planner-operator" \
  --label "org.opencontainers.image.description=$description" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.created=$created" \
  --label "org.opencontainers.image.source=https://github.com/planner-operator/planner-operator" \
  --label "org.opencontainers.image.licenses=Apache-2.0" \
  --label "org.opencontainers.image.vendor=planner-operator" >/dev/null

# --- Check the artifact: what a runtime would get from it ---------------------------------------
log "checking $out"
summary="$("$IMAGE_TOOL" check "$out")" || fail "$out is not a valid image"
mapfile -t entrypoint < <("$IMAGE_TOOL" config "$out" entrypoint)
mapfile -t image_env < <("$IMAGE_TOOL" config "$out" env)
user="$("$IMAGE_TOOL" config "$out" user)"
workdir="$("$IMAGE_TOOL" config "$out" workdir)"
((${#entrypoint[@]} > 0)) || fail "the image has no entrypoint"
[[ "$user" =~ ^([0-9]+):([0-9]+)$ ]] || fail "the image's user '$user' is not numeric UID:GID"
uid="${BASH_REMATCH[1]}" gid="${BASH_REMATCH[2]}"

check_root="$work/extracted"
mkdir -p "$check_root"
"$IMAGE_TOOL" extract "$out" | tar -x -p --numeric-owner -C "$check_root" -f - ||
  fail "extracting the image's layers failed"
rootfs_bytes="$(du -sb "$check_root" | cut -f1)"
# Mount points a runtime provides; in the extracted copy, not in the image.
mkdir -p "$check_root/proc" "$check_root/dev"
for dev in null zero random urandom; do
  : >"$check_root/dev/$dev"
done
# Cross-built: the entrypoint runs under qemu's user-mode emulator (a static binary, copied into
# the extracted root only), which loads the image's own loader and libraries.
emulator=()
if [[ -n "$cross" ]]; then
  install -m 0755 "$(command -v "$qemu")" "$check_root/.$qemu"
  emulator=("/.$qemu")
fi

# in_image ARG...: runs the entrypoint with ARGs as a container would, output to stdout/stderr.
as_user=(--setgid "$gid" --setuid "$uid")
userns=()
if [[ "$(id -u)" != 0 ]]; then
  log "warning: not root: the check runs the entrypoint as root in a user namespace, not as $user"
  as_user=()
  userns=(--user --map-root-user)
fi
unshare_bin="$(command -v unshare)"
in_image() {
  env -i "${image_env[@]}" "$unshare_bin" "${userns[@]}" --mount --propagation private --pid --fork -- \
    "$BASH" -c '
      set -e
      root="$1" wd="$2" unshare="$3"; shift 3
      for dev in null zero random urandom; do mount --bind "/dev/$dev" "$root/dev/$dev"; done
      mount -t proc proc "$root/proc"
      exec "$unshare" --root="$root" --wd="$wd" "$@"
    ' in_image "$check_root" "${workdir:-/}" "$unshare_bin" "${as_user[@]}" -- "${emulator[@]}" "${entrypoint[@]}" "$@"
}

help_out="$work/help.txt"
in_image --help >"$help_out" 2>&1 || fail_with_log "the image's entrypoint failed with --help" "$help_out"
version_out="$work/version.txt"
in_image version >"$version_out" 2>&1 || fail_with_log "the image's entrypoint failed with \`version\`" "$version_out"
grep -qF "$version" "$version_out" || fail_with_log "\`version\` in the image does not print $version" "$version_out"

image_bytes="$(stat -c %s "$out")"
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
log "ran ${entrypoint[*]} --help and version in the $arch image${cross:+ (under $qemu)} as $([[ ${#as_user[@]} -gt 0 ]] && echo "$user" || echo root): $(head -n1 "$version_out")"
log "$summary"
log "image $IMAGE_REPOSITORY:$version: $out"
log "  tarball $(mib "$image_bytes") ($image_bytes bytes, layer gzip-compressed); root filesystem $(mib "$rootfs_bytes") ($rootfs_bytes bytes)"
log "  release build ${build_seconds}s, image $((SECONDS - start - build_seconds))s besides"
