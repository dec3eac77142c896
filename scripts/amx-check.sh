#!/usr/bin/env bash
# Checks and times Tandem's AMX kernels on a CPU that has AMX (Sapphire Rapids
# and later), in a few minutes: the AMX tests on the real tiles (the self-checks,
# the drivers against the AVX512-VNNI kernels, batch invariance), then
# `tandem bench model` with the AVX-512 kernels and with the AMX ones, and the
# calibration's own choice.
#
#   usage: bash scripts/amx-check.sh [DIR]
#
# With Go on PATH it builds what it runs into DIR (default: a temporary
# directory); without, it runs DIR/tensor.test and DIR/tandem built elsewhere by
#   go test -c -o DIR/tensor.test ./internal/tensor/ && go build -o DIR/tandem ./cmd/tandem
# (static binaries: copy DIR to the machine). FORMATS and TOKENS choose what the
# benchmark times (default bf16,q8_0,q4_0,q4_k,q6_k and 128).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-$(mktemp -d)}"
formats="${FORMATS:-bf16,q8_0,q4_0,q4_k,q6_k}"
tokens="${TOKENS:-128}"
if command -v go >/dev/null; then
  go test -c -o "$dir/tensor.test" ./internal/tensor/
  go build -o "$dir/tandem" ./cmd/tandem
fi
echo "== CPU"
grep -m1 'model name' /proc/cpuinfo || true
{ grep -o -w -E 'amx_(tile|bf16|int8)' /proc/cpuinfo | sort -u | tr '\n' ' ' || true; }; echo
echo "== the AMX tests on this CPU"
(cd internal/tensor && "$dir/tensor.test" -test.count=1 -test.v -test.run 'AMX|Peak' 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok)|amx|AMX' || true)
echo "== bench model: AVX-512 kernels"
TANDEM_KERNELS=avx512bf16/avx512vnni "$dir/tandem" bench model --formats "$formats" --tokens "$tokens"
echo "== bench model: AMX kernels"
TANDEM_KERNELS=amxbf16/amx "$dir/tandem" bench model --formats "$formats" --tokens "$tokens" || echo "(the AMX kernels are not available here: see above)"
echo "== bench model: the calibration's choice"
XDG_CACHE_HOME="$dir/cache" "$dir/tandem" bench model --formats "$formats" --tokens "$tokens"
