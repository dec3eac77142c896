#!/usr/bin/env bash
# Builds (or reuses from a cache) the Kubernetes control-plane binaries that the
# tests run for real: kube-apiserver, kubectl and etcd, at pinned versions.
#
#   usage: bash scripts/kube-binaries.sh
#
# The binaries land in
#   ${XDG_CACHE_HOME:-$HOME/.cache}/tandem/kube/k8s-$K8S_VERSION-etcd-$ETCD_VERSION/bin/
# and that directory is printed as the last line on stdout (progress goes to
# stderr), so a caller can do
#   export TANDEM_KUBE_BIN="$(bash scripts/kube-binaries.sh | tail -n1)"
# A warm cache returns at once. A cold build takes a few minutes on 2 cores and
# about 2.5 GB of memory; it is done in a temporary directory that is renamed
# into place only when every binary is built, so an interrupted build never
# leaves a half-filled cache.
#
# Everything comes from the Go module proxy through the go command:
#   - k8s.io/kubernetes: its go.mod replaces the k8s.io/* staging modules with
#     ./staging, which the module zip lacks, so a copy of the module source is
#     built whose go.mod drops that replace block and requires the published
#     k8s.io/* v0.x modules (same minor) instead;
#   - etcd: go.etcd.io/etcd/server/v3 (the etcd main package), built through
#     a scratch module that requires it as a tool.
set -euo pipefail

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.7.3

log() { echo "kube-binaries: $*" >&2; }

# shellcheck source=scripts/lib/cached-build.sh
. "$(dirname "$0")/lib/cached-build.sh"

build_kube() {
  # --- kube-apiserver and kubectl -------------------------------------------
  log "downloading k8s.io/kubernetes@$K8S_VERSION"
  moddir="$(cd "$work" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')"
  [ -n "$moddir" ] && [ -f "$moddir/go.mod" ] || { log "go mod download gave no source for k8s.io/kubernetes@$K8S_VERSION"; exit 1; }

  src="$work/kubernetes"
  cp -R "$moddir" "$src"
  chmod -R u+w "$src"
  # The zip carries go.work and a vendor/ that only holds OWNERS; neither applies.
  rm -rf "$src/go.work" "$src/go.work.sum" "$src/vendor"

  # Staging modules are published as k8s.io/<name> v0.<minor>.<patch>; the
  # module requires them at v0.0.0 and replaces them with ./staging/src/...
  staging_version="v0.${K8S_VERSION#v1.}"
  edits=()
  while read -r mod; do
    edits+=("-dropreplace=$mod")
  done < <(cd "$src" && go mod edit -json |
    awk '/"Replace": \[/{r=1} r && /"Old":/{o=1} r && o && /"Path":/{gsub(/[",]/,""); print $2; o=0}')
  nrepl=${#edits[@]}
  while read -r mod; do
    edits+=("-require=$mod@$staging_version")
  done < <(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$src/go.mod")
  [ "$nrepl" -gt 0 ] && [ "${#edits[@]}" -gt "$nrepl" ] || { log "unexpected k8s.io/kubernetes go.mod: no staging replace block"; exit 1; }
  (cd "$src" && go mod edit "${edits[@]}")
  if grep -q '=> \./staging' "$src/go.mod"; then log "a ./staging replace is left in go.mod"; exit 1; fi
  log "dropped $nrepl staging replaces; required $((${#edits[@]} - nrepl)) staging modules at $staging_version"

  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done

  for cmd in kube-apiserver kubectl; do
    log "building $cmd ($((SECONDS - build_start)) s so far)"
    (cd "$src" && go build -trimpath -ldflags="$ldflags" -o "$work/out/bin/$cmd" "./cmd/$cmd")
  done

  # --- etcd -------------------------------------------------------------------
  log "building etcd $ETCD_VERSION ($((SECONDS - build_start)) s so far)"
  etcdmod="$work/etcd"
  mkdir -p "$etcdmod"
  (
    cd "$etcdmod"
    go mod init tandem.invalid/etcdbuild >/dev/null 2>&1
    go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
    go build -trimpath -ldflags="-s -w" -o "$work/out/bin/etcd" go.etcd.io/etcd/server/v3
  )

  "$work/out/bin/kubectl" version --client >&2
  "$work/out/bin/kube-apiserver" --version >&2
  "$work/out/bin/etcd" --version >&2
}

cached_build kube "k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}" build_kube kube-apiserver kubectl etcd
echo "$cached_bin"
