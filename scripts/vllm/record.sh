#!/usr/bin/env bash
# Records vLLM's wire payloads into testdata/vllm/<vllm version>/ (see
# scripts/vllm/record.py): installs vLLM (scripts/vllm/install.sh), writes a
# random-weight smollm2-135m-shaped model with `tandem model init`, and runs the
# recorder against it, a real `vllm serve` included. Pass --no-serve to record
# only what needs no running engine.
#
#   usage: bash scripts/vllm/record.sh [--no-serve]
#
# Then `go test ./internal/kvevents/ ./internal/kvparams/ ./internal/proxy/
# -run VLLM` checks Tandem against what was recorded; a diff of two version
# directories shows what changed on vLLM's wire between them.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
python="$(bash "$root/scripts/vllm/install.sh" | tail -n1)"
model="$(mktemp -d)"
trap 'rm -rf "$model"' EXIT
(cd "$root" && go run ./cmd/tandem model init --shape smollm2-135m --seed 1 --out "$model") >&2
cd "$root"
VLLM_TARGET_DEVICE=cpu "$python" scripts/vllm/record.py --model "$model" --out testdata/vllm "$@"
