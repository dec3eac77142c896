#!/usr/bin/env bash
# Builds (or reuses from a cache) Jaeger v2 (the `jaeger` binary: an
# OpenTelemetry Collector with Jaeger's storage and query extensions) at a
# pinned version, for the tests that send traces to a real Jaeger and read
# them back through its query API (internal/jaegertest).
#
#   usage: bash scripts/jaeger-binary.sh
#
# The binary lands in
#   ${XDG_CACHE_HOME:-$HOME/.cache}/tandem/jaeger/$JAEGER_VERSION/bin/jaeger
# and that path is printed as the last line on stdout (progress goes to
# stderr), so a caller can do
#   export TANDEM_JAEGER="$(bash scripts/jaeger-binary.sh | tail -n1)"
# A warm cache returns at once. A cold build compiles cmd/jaeger of the
# github.com/jaegertracing/jaeger module from the Go module proxy with the
# module's own go.mod and go.sum (a copy of the module source: the module
# cache is read-only), niced: about 520 CPU-seconds and 2.1 GB of memory
# (29 min of wall time on a shared, loaded 2-core host; the CPU time
# suggests 4 to 5 minutes on 2 idle cores; docs/performance.md).
# It is built in a temporary directory renamed into place only when done, so
# an interrupted build never leaves a half-filled cache. The UI assets are not
# in the module zip; the binary serves a placeholder page instead, and the
# query API (/api/traces) is unaffected.
set -euo pipefail

JAEGER_VERSION=v1.75.0

log() { echo "jaeger-binary: $*" >&2; }

# shellcheck source=scripts/lib/cached-build.sh
. "$(dirname "$0")/lib/cached-build.sh"

build_jaeger() {
  moddir="$(cd "$work" && go mod download -json "github.com/jaegertracing/jaeger@$JAEGER_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')"
  [ -n "$moddir" ] && [ -f "$moddir/go.mod" ] || { log "go mod download gave no source for github.com/jaegertracing/jaeger@$JAEGER_VERSION"; exit 1; }
  src="$work/jaeger"
  cp -R "$moddir" "$src"
  chmod -R u+w "$src"

  pkg="github.com/jaegertracing/jaeger/internal/version"
  ldflags="-s -w -X $pkg.latestVersion=$JAEGER_VERSION -X $pkg.commitSHA=module-proxy -X $pkg.date=1970-01-01T00:00:00Z"
  log "building cmd/jaeger $JAEGER_VERSION ($((SECONDS - build_start)) s so far)"
  (cd "$src" && nice -n 10 go build -trimpath -ldflags="$ldflags" -o "$work/out/bin/jaeger" ./cmd/jaeger)
  "$work/out/bin/jaeger" version >&2
}

cached_build jaeger "$JAEGER_VERSION" build_jaeger jaeger
echo "$cached_bin/jaeger"
