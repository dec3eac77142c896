# Sourced by the scripts that build a test dependency once from the Go module
# proxy and reuse it from the user cache (jaeger-binary.sh, promtool-binary.sh,
# kube-binaries.sh). It holds what they share: the warm check, one build at a
# time per cache, the scratch directory and its cleanup, the Go environment of
# a reproducible build, and publishing the result only when it is whole.
#
#   cached_build NAME KEY BUILD BIN...
#
# looks for BIN... (executables) in
#   ${XDG_CACHE_HOME:-$HOME/.cache}/tandem/NAME/KEY/bin
# and, when one is missing, calls the function BUILD with $work set to an
# empty scratch directory under the cache; BUILD writes the binaries into
# $work/out/bin (progress to stderr). The directory is renamed into place only
# when every BIN is there, so an interrupted build never leaves a half-filled
# cache. On return $cached_bin is the binaries' directory and $build_start
# the script's SECONDS when the build began (unset on a warm cache). A caller
# defines log() first.

cached_build() {
  local name="$1" key="$2" build="$3"
  shift 3
  local bins=("$@") cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/tandem/$name"
  cached_bin="$cache_root/$key/bin"

  cached_build_have() {
    local b
    for b in "${bins[@]}"; do
      [ -x "$cached_bin/$b" ] || return 1
    done
  }
  cached_build_have && return 0

  command -v go >/dev/null || { log "go is not on PATH"; exit 1; }
  mkdir -p "$cache_root"

  # One build at a time per cache: a second caller waits, then finds it.
  if command -v flock >/dev/null; then
    exec 9>"$cache_root/.lock"
    flock 9
    cached_build_have && return 0
  fi

  # $work is global: the EXIT trap removes it (the module cache's copies are
  # read-only, hence the chmod).
  work="$(mktemp -d "$cache_root/.build-$key.XXXXXX")"
  trap 'chmod -R u+w "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
  mkdir -p "$work/out/bin"
  export GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0
  export GOFLAGS="-mod=mod -buildvcs=false"
  build_start=$SECONDS
  log "cold build with $(go env GOVERSION) into $cached_bin"
  "$build"

  local b
  for b in "${bins[@]}"; do
    [ -x "$work/out/bin/$b" ] || { log "$b was not built"; exit 1; }
  done
  rm -rf "$cache_root/$key"
  mv -T "$work/out" "$cache_root/$key"
  log "built in $((SECONDS - build_start)) s: $(cd "$cached_bin" && du -h "${bins[@]}" | tr '\t\n' '  ')"
}
