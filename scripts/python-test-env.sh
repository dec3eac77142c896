#!/usr/bin/env bash
# Creates (or reuses) the Python virtual environment the Go tests use, with the
# packages pinned in scripts/requirements-test.txt, installed by pip.
#
#   usage: bash scripts/python-test-env.sh
#
# The environment lives in ${XDG_CACHE_HOME:-$HOME/.cache}/tandem/pyenv; its
# python is printed as the last line on stdout (progress goes to stderr), so a
# caller can do
#   export TANDEM_PYTHON="$(bash scripts/python-test-env.sh | tail -n1)"
# The tests look for TANDEM_PYTHON, then that path, then python3 on PATH.
#
# Idempotent: a marker file holds the SHA-256 of the requirements it was built
# from, written only after pip succeeded; a warm, matching environment returns
# at once, anything else (missing, half-built, other requirements) is rebuilt
# from scratch. The system Python is never installed into.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
req="$here/requirements-test.txt"
dest="${XDG_CACHE_HOME:-$HOME/.cache}/tandem/pyenv"
marker="$dest/.tandem-requirements.sha256"

log() { echo "python-test-env: $*" >&2; }

want="$(sha256sum "$req" | cut -d' ' -f1)"
if [ -x "$dest/bin/python" ] && [ "$(cat "$marker" 2>/dev/null)" = "$want" ] \
  && "$dest/bin/python" -c 'import zmq, msgpack' 2>/dev/null; then
  echo "$dest/bin/python"
  exit 0
fi

python="${TANDEM_BASE_PYTHON:-python3}"
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  log "$python lacks venv or ensurepip: install python3-venv (Debian) or set TANDEM_BASE_PYTHON to a Python 3 that has them"
  exit 1
fi
log "building $dest from $req"
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
"$python" -m venv "$dest"
"$dest/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$req" >&2
"$dest/bin/python" -c 'import zmq, msgpack; print("python-test-env: pyzmq", zmq.__version__, "libzmq", zmq.zmq_version(), "msgpack", msgpack.version)' >&2
echo "$want" >"$marker"
echo "$dest/bin/python"
