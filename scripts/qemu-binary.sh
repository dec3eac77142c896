#!/usr/bin/env bash
# Fetches (or reuses from a cache) QEMU's user-mode arm64 emulator, for the
# tests that run Tandem's arm64 (NEON) kernels on an amd64 machine
# (internal/tensor's TestARM64KernelsUnderQEMU): Debian's qemu-user-static
# package, unpacked, not installed.
#
#   usage: bash scripts/qemu-binary.sh
#
# The emulator lands in
#   ${XDG_CACHE_HOME:-$HOME/.cache}/tandem/qemu/$QEMU_VERSION/bin/qemu-aarch64
# and that directory is printed as the last line on stdout (progress goes to
# stderr), so a caller can do
#   export TANDEM_QEMU="$(bash scripts/qemu-binary.sh | tail -n1)"
# A warm cache returns at once; a cold one downloads 63 MB. Where Debian's pool
# no longer has the pinned version (a point release replaces it), the current
# one comes through apt-get download instead.
set -euo pipefail

QEMU_VERSION=7.2+dfsg-7+deb12u18+b3
QEMU_DEB="qemu-user-static_${QEMU_VERSION}_amd64.deb"
QEMU_URL="https://deb.debian.org/debian/pool/main/q/qemu/${QEMU_DEB//+/%2B}"
QEMU_SHA256=c3e3ba2bd87f8c5b9a5da5ef21b5a3b82d7c63b89dd448d9ddaa4eabc5b6e402

log() { echo "qemu-binary: $*" >&2; }

# shellcheck source=scripts/lib/cached-build.sh
. "$(dirname "$0")/lib/cached-build.sh"

fetch_qemu() {
  command -v dpkg-deb >/dev/null || { log "dpkg-deb is not on PATH"; exit 1; }
  log "downloading $QEMU_URL"
  if curl -fsSL --retry 3 -o "$work/qemu.deb" "$QEMU_URL"; then
    echo "$QEMU_SHA256  $work/qemu.deb" | sha256sum -c --quiet - >&2
  else
    log "not in the pool: apt-get download qemu-user-static"
    (cd "$work" && apt-get download qemu-user-static >&2 && mv qemu-user-static_*.deb qemu.deb)
  fi
  dpkg-deb -x "$work/qemu.deb" "$work/deb"
  cp "$work/deb/usr/bin/qemu-aarch64-static" "$work/out/bin/qemu-aarch64"
}

cached_build qemu "$QEMU_VERSION" fetch_qemu qemu-aarch64
echo "$cached_bin"
