#!/usr/bin/env bash
# Builds (or reuses from a cache) Prometheus's promtool at a pinned version,
# for deploy/observability's tests (`promtool check rules`, `promtool test
# rules`).
#
#   usage: bash scripts/promtool-binary.sh
#
# The binary lands in
#   ${XDG_CACHE_HOME:-$HOME/.cache}/tandem/promtool/$PROMETHEUS_VERSION/bin/promtool
# and that path is printed as the last line on stdout (progress goes to
# stderr), so a caller can do
#   export TANDEM_PROMTOOL="$(bash scripts/promtool-binary.sh | tail -n1)"
# A warm cache returns at once. A cold build (about 30 minutes on 2 busy
# cores, niced; promtool links every service-discovery SDK) compiles the
# prometheus module's promtool from the Go module proxy (github.com/prometheus/prometheus, whose
# v0.3xx.y versions are Prometheus 3.xx.y) through a scratch module that
# requires it as a tool; it is built in a temporary directory renamed into
# place only when done, so an interrupted build never leaves a half cache.
set -euo pipefail

PROMETHEUS_VERSION=v0.316.0

log() { echo "promtool-binary: $*" >&2; }

# shellcheck source=scripts/lib/cached-build.sh
. "$(dirname "$0")/lib/cached-build.sh"

build_promtool() {
  log "building promtool $PROMETHEUS_VERSION"
  mkdir -p "$work/mod"
  (
    cd "$work/mod"
    go mod init tandem.invalid/promtoolbuild >/dev/null 2>&1
    go get -tool "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION" >&2
    go build -trimpath -ldflags="-s -w" -o "$work/out/bin/promtool" github.com/prometheus/prometheus/cmd/promtool
  )
  "$work/out/bin/promtool" --version >&2
}

cached_build promtool "$PROMETHEUS_VERSION" build_promtool promtool
echo "$cached_bin/promtool"
