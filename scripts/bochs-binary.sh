#!/usr/bin/env bash
# Builds (or reuses from a cache) the Bochs x86 emulator with AMX, for the
# tests that run AMX kernels on a CPU without AMX (internal/bochs): Bochs 3.0
# from Debian's source package (the upstream release, as Debian ships it,
# which builds with --enable-amx too), configured without a GUI.
#
#   usage: bash scripts/bochs-binary.sh
#
# The emulator and its BIOS (SeaBIOS 1.13, in the same source) land in
#   ${XDG_CACHE_HOME:-$HOME/.cache}/tandem/bochs/$BOCHS_KEY/bin/{bochs,bios.bin}
# and that directory is printed as the last line on stdout (progress goes to
# stderr), so a caller can do
#   export TANDEM_BOCHS="$(bash scripts/bochs-binary.sh | tail -n1)"
# A warm cache returns at once; a cold build takes about a minute on 2 cores.
#
# One fix is applied to the source: Bochs 3.0 (and upstream as of 2026-08)
# widens the bytes of the signed AMX-INT8 dot products (TDPBSSD, TDPBSUD,
# TDPBUSD) as unsigned (cpu/avx/amx.cc: Bit32s() of a Bit8u), so that they
# compute TDPBUUD's sums; Intel's definition sign-extends them.
# internal/bochs's TestAMXIsThere checks the result against that definition.
set -euo pipefail

BOCHS_VERSION=3.0+dfsg
BOCHS_TARBALL="bochs_${BOCHS_VERSION}.orig.tar.xz"
BOCHS_URL="https://deb.debian.org/debian/pool/main/b/bochs/$BOCHS_TARBALL"
BOCHS_SHA256=78f6c73d4a6472d5130a87ab9dc306d02c7c71ed8e25b3a8ef642e2a7acd282b
# The cache key: the source and the fix applied to it.
BOCHS_KEY="$BOCHS_VERSION-amxsigned"

log() { echo "bochs-binary: $*" >&2; }

# shellcheck source=scripts/lib/cached-build.sh
. "$(dirname "$0")/lib/cached-build.sh"

build_bochs() {
  for tool in curl g++ make xz; do
    command -v "$tool" >/dev/null || { log "$tool is not on PATH"; exit 1; }
  done
  log "downloading $BOCHS_URL"
  curl -fsSL --retry 3 -o "$work/$BOCHS_TARBALL" "$BOCHS_URL"
  echo "$BOCHS_SHA256  $work/$BOCHS_TARBALL" | sha256sum -c --quiet - >&2
  tar -xJf "$work/$BOCHS_TARBALL" -C "$work"
  cd "$work/bochs-3.0"
  log "sign-extending the signed bytes of the AMX-INT8 dot products"
  fixed="$(grep -cE 'Bit32s\([xy]byte\[[0-3]\]\)' cpu/avx/amx.cc)"
  [ "$fixed" = 12 ] || { log "cpu/avx/amx.cc: expected 12 lines to fix, found $fixed"; exit 1; }
  sed -i -E 's/Bit32s\(([xy])byte\[([0-3])\]\)/Bit32s(Bit8s(\1byte[\2]))/g' cpu/avx/amx.cc
  log "configuring (no GUI; x86-64, AVX, EVEX, AMX)"
  ./configure --with-nogui --enable-x86-64 --enable-cpu-level=6 --enable-avx --enable-evex --enable-amx \
    --enable-all-optimizations --disable-plugins >"$work/configure.log" 2>&1 ||
    { tail -n 30 "$work/configure.log" >&2; exit 1; }
  log "building"
  make -j"$(nproc)" bochs >"$work/make.log" 2>&1 || { tail -n 30 "$work/make.log" >&2; exit 1; }
  cp bochs "$work/out/bin/bochs"
  cp bios/bios.bin-1.13.0 "$work/out/bin/bios.bin"
  chmod +x "$work/out/bin/bios.bin"
  cd "$work"
}

cached_build bochs "$BOCHS_KEY" build_bochs bochs bios.bin
echo "$cached_bin"
