#!/usr/bin/env bash
# Real-shape measurements, Tandem against llama.cpp on the same GGUF files,
# alternated in one window (docs/performance.md, "Real shapes against
# llama.cpp"). For each round and each FILE: Tandem's PrefillLong (128 and
# 2048 tokens), Decode (one stream, context 128) and DecodeBatch16 on two
# threads, then llama.cpp's bench.mjs (node-llama-cpp 3.21.1) on two
# threads; the stream read limit (BenchmarkStreamRead) at the start and
# the end.
#
#   tandem model init --shape qwen3-0.6b --dtype q4_k_m --out /tmp/q.gguf   # and so on
#   flock /tmp/tandem-bench.lock scripts/reference/realshape_bench.sh ROUNDS FILE.gguf...
#
# TANDEM_LLAMACPP names a directory with node-llama-cpp installed and
# bench.mjs beside it (default scripts/reference/llamacpp after `npm ci`).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
nlc=${TANDEM_LLAMACPP:-$root/scripts/reference/llamacpp}
rounds=$1
shift
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
(cd "$root" && go test -c -o "$bin/model.test" ./internal/model/ && go test -c -o "$bin/tensor.test" ./internal/tensor/)
stream() { "$bin/tensor.test" -test.run '^$' -test.bench 'StreamRead' -test.benchtime 5x | grep Benchmark; }
echo "== $(date -u +%H:%M:%S) stream read"; stream
for r in $(seq "$rounds"); do
	for f in "$@"; do
		echo "== $(date -u +%H:%M:%S) round $r tandem $f"
		TANDEM_BENCH_MODEL=$f TANDEM_BENCH_TOKENS=128,2048 "$bin/model.test" -test.run '^$' -test.bench 'PrefillLong/.*/threads=2$' -test.benchtime 1x | grep Benchmark
		TANDEM_BENCH_MODEL=$f "$bin/model.test" -test.run '^$' -test.bench '^BenchmarkDecode$/threads=2$' -test.benchtime 16x | grep Benchmark
		TANDEM_BENCH_MODEL=$f "$bin/model.test" -test.run '^$' -test.bench 'DecodeBatch16/threads=2$' -test.benchtime 3x | grep Benchmark
		echo "== $(date -u +%H:%M:%S) round $r llama.cpp $f"
		(cd "$nlc" && BENCH_RUNS=1 node bench.mjs "$f" 2)
	done
done
echo "== $(date -u +%H:%M:%S) stream read"; stream
