#!/usr/bin/env bash
# Regenerates internal/bench/experiment/testdata/gridmerge: the saved runs
# that `tandem bench report --merge` is tested on (gridmerge_test.go). Three
# tiny phased P/D experiments on simulated engines, all with the same seed
# and workload flags:
#   combined/  the static configurations and the adaptive one's cells in one
#              run (its report.txt is what the merged report must reproduce);
#   statics/   the static configurations alone;
#   adaptive/  the adaptive configuration's cells alone.
# Only results-*.json (and combined/report.txt) are kept.
#
#   usage: bash scripts/gridmerge-fixtures.sh
#
# About two minutes on two cores (the default random-weight model is created
# in the user cache first if it is not there).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/internal/bench/experiment/testdata/gridmerge"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

go build -o "$work/tandem" "$root/cmd/tandem"

# Every part: the same workload, seed, rates, rounds, warm-up and SLO.
common=(--engines 2 --workloads chat --chat-rates 10,40,80 --requests 4 --rounds 2 --warmup 2
  --max-context 128 --seed 7 --slo-chat-ttft 15ms --slo-chat-tpot 2ms --mnbt-sweep 256
  --adaptive-ttft-scales 0.5,1 --adaptive-tpot-scales 1,2
  --engine-args "--simulate --sim-speed 8 --log-level warn")

run() { # name configs
  echo "gridmerge-fixtures: $1 ($2)" >&2
  "$work/tandem" bench experiment pd --out "$work/$1" --configs "$2" "${common[@]}" >"$work/$1.out" 2>&1 ||
    { cat "$work/$1.out" >&2; exit 1; }
}
run combined pd,conditional,adaptive
run statics pd,conditional
run adaptive adaptive

rm -rf "$dest"
for part in combined statics adaptive; do
  mkdir -p "$dest/$part"
  cp "$work/$part"/results-*.json "$dest/$part/"
done
cp "$work/combined/report.txt" "$dest/combined/"
du -sh "$dest" >&2
