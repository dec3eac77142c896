#!/usr/bin/env bash
# Tandem against llama.cpp per weight format on the same GGUF files,
# alternated in one window (docs/performance.md, "Tandem against a native
# llama.cpp per format"). For each round, FILE and thread count: Tandem's
# PrefillLong at 128 and 2,048 tokens and Decode (one stream, context 128),
# then llama.cpp's llama-bench on the same file and thread count: prefill of
# 128 and 2,048 tokens (pp128, pp2048) and 32 tokens of one stream after a
# 128-token prompt (tg32 at depth 128). Both engines run one untimed warm-up
# of each test first. Results are appended to RESULTS.tsv, one line per
# measurement; `table` prints them as a Markdown table (best of the rounds).
#
#   tandem model init --shape qwen3-0.6b --out /data/qwen3-0.6b          # bf16 safetensors
#   tandem model quantize --type q8_0 --out /data/qwen3-0.6b.q8_0.gguf /data/qwen3-0.6b   # and bf16, q4_k_m, f32
#   LLAMA_BENCH=/opt/llama.cpp/build/bin/llama-bench \
#     flock /tmp/tandem-bench.lock scripts/reference/format_bench.sh run out.tsv /data/qwen3-0.6b.*.gguf
#   scripts/reference/format_bench.sh table out.tsv
#
# Files are named MODEL.FORMAT.gguf (the table's first two columns).
# Environment: LLAMA_BENCH, the llama-bench binary (required for the
# llama.cpp engine; build it natively, docs/performance.md says how);
# THREADS (default "1 2"); ROUNDS (default 1); ENGINES (default
# "tandem llama.cpp"; "tandem:LABEL" adds a Tandem built elsewhere, from the
# test binaries model.test and tensor.test in $FORMAT_BENCH_BIN/LABEL, e.g. a
# build before a change, `go test -c -o DIR/before/model.test ./internal/model/`,
# so that before and after alternate in one window; a Tandem engine may end in
# "@KV", a `tandem serve --kv-cache-dtype` value, e.g. "tandem@bfloat16" or
# "tandem:before@bfloat16", to run with that KV-cache element type instead of
# the model's default (bf16 for bf16 and quantized models, f32 for f32 ones;
# llama.cpp's is f16); "prebuilt" adds node-llama-cpp's prebuilt llama.cpp
# through bench.mjs in TANDEM_LLAMACPP, a directory with node-llama-cpp
# installed and bench.mjs beside it, default scripts/reference/llamacpp
# after `npm ci`; its prefill is the better of two runs, the first a
# warm-up in effect); TESTS (default "prefill128 prefill2048
# decode"); FORMAT_BENCH_BIN, a directory to keep the compiled Tandem test
# binaries in (default: a temporary one, compiled on each run).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)

usage() {
	echo "usage: $0 run RESULTS.tsv MODEL.FORMAT.gguf... | $0 table RESULTS.tsv" >&2
	exit 2
}

# table prints RESULTS.tsv as one Markdown row per file and thread count:
# tok/s of each engine per test, the best of the rounds, each Tandem's ratio
# to the first other engine (llama.cpp), and decode's read rate (tok/s times the file's bytes: every
# model here ties its head to the embedding, so a token reads every byte).
table() {
	python3 - "$1" <<'EOF'
import collections, sys
best = collections.defaultdict(float)
sizes, order = {}, []
for line in open(sys.argv[1]):
    f = line.rstrip("\n").split("\t")
    if len(f) < 7 or f[0] == "utc":
        continue
    _, label, engine, threads, test, rate, size = f[:7]
    key = (label, int(threads))
    if key not in order:
        order.append(key)
    sizes[label] = int(size)
    best[key + (engine, test)] = max(best[key + (engine, test)], float(rate))
# base strips a Tandem engine's build label (":LABEL") and KV type ("@KV").
base = lambda e: e.split("@")[0].split(":")[0]
def erank(e):
    if base(e) == "tandem":
        return (0 if ":" in e.split("@")[0] else 1, "@" in e, e)
    return ({"llama.cpp": 2, "prebuilt": 3}.get(e, 9), False, e)
engines = sorted({k[2] for k in best}, key=erank)
mine = [i for i, e in enumerate(engines) if base(e) == "tandem"]
ref = next((i for i, e in enumerate(engines) if base(e) != "tandem"), None)
tests = [t for t in ("prefill128", "prefill2048", "decode") if any(k[3] == t for k in best)]
head = ["model", "format", "threads"] + [f"{t}: {' / '.join(engines)}" for t in tests]
if "decode" in tests:
    head.append(f"decode GB/s: {' / '.join(engines)}")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * 3 + "---:|" * (len(head) - 3))
fmt = lambda v: "–" if v == 0 else (f"{v:.0f}" if v >= 100 else f"{v:.1f}")
forms = ["f32", "bf16", "q8_0", "q4_k_m"]
def rank(key):
    model, _, form = key[0].rpartition(".")
    return (model, forms.index(form) if form in forms else 9, form, key[1])
for label, threads in sorted(order, key=rank):
    model, _, form = label.rpartition(".")
    row = [model, form, str(threads)]
    for t in tests:
        v = [best[(label, threads, e, t)] for e in engines]
        cell = " / ".join(fmt(x) for x in v)
        # each Tandem's ratio to the first other engine (llama.cpp), when both ran.
        ratios = [f"**{v[i] / v[ref]:.2f}×**" for i in mine if ref is not None and v[i] and v[ref]]
        if ratios:
            cell += " (" + ", ".join(ratios) + ")"
        row.append(cell)
    if "decode" in tests:
        row.append(" / ".join(f"{best[(label, threads, e, 'decode')] * sizes[label] / 1e9:.1f}" if best[(label, threads, e, 'decode')] else "–" for e in engines))
    print("| " + " | ".join(row) + " |")
EOF
}

[ $# -ge 2 ] || usage
cmd=$1 out=$2
shift 2
case $cmd in
table)
	table "$out"
	exit 0
	;;
run) [ $# -ge 1 ] || usage ;;
*) usage ;;
esac

threads=${THREADS:-1 2}
rounds=${ROUNDS:-1}
engines=${ENGINES:-tandem llama.cpp}
tests=${TESTS:-prefill128 prefill2048 decode}
nlc=${TANDEM_LLAMACPP:-$root/scripts/reference/llamacpp}
bin=${FORMAT_BENCH_BIN:-}
if [ -z "$bin" ]; then
	bin=$(mktemp -d)
	trap 'rm -rf "$bin"' EXIT
fi
if [[ " $engines " == *" llama.cpp "* ]] && [ ! -x "${LLAMA_BENCH:-}" ]; then
	echo "$0: LLAMA_BENCH must name llama.cpp's llama-bench binary (see docs/performance.md)" >&2
	exit 2
fi
mkdir -p "$bin"
(cd "$root" && go test -c -o "$bin/model.test" ./internal/model/ && go test -c -o "$bin/tensor.test" ./internal/tensor/)
[ -s "$out" ] || printf 'utc\tfile\tengine\tthreads\ttest\ttok/s\tbytes\n' >"$out"

now() { date -u +%H:%M:%S; }
# record FILE ENGINE THREADS TEST RATE appends one result and echoes it.
record() {
	local label
	label=$(basename "$1" .gguf)
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(now)" "$label" "$2" "$3" "$4" "$5" "$(stat -c %s "$1")" | tee -a "$out"
}
# tokps pulls the tok/s figure out of `go test -bench` output.
tokps() { awk '/^Benchmark/ { for (i = 2; i <= NF; i++) if ($i == "tok/s") print $(i - 1) }' | tail -1; }

tandem() { # FILE THREADS BINDIR ENGINE [KV]
	local f=$1 t=$2 b=$3 r
	export TANDEM_BENCH_KV=${5:-}
	for test in $tests; do
		case $test in
		prefill128) r=$(TANDEM_BENCH_MODEL=$f TANDEM_BENCH_TOKENS=128 "$b/model.test" -test.run '^$' -test.bench "PrefillLong/tokens=128/threads=$t\$" -test.benchtime 3x | tokps) ;;
		prefill2048) r=$(TANDEM_BENCH_MODEL=$f TANDEM_BENCH_TOKENS=2048 "$b/model.test" -test.run '^$' -test.bench "PrefillLong/tokens=2048/threads=$t\$" -test.benchtime 1x | tokps) ;;
		decode) r=$(TANDEM_BENCH_MODEL=$f "$b/model.test" -test.run '^$' -test.bench "^BenchmarkDecode\$/threads=$t\$" -test.benchtime 32x | tokps) ;;
		esac
		record "$f" "$4" "$t" "$test" "${r:-0}"
	done
}

llamacpp() { # FILE THREADS
	local f=$1 t=$2 args r
	for test in $tests; do
		case $test in
		prefill128) args=(-p 128 -n 0 -r 3) ;;
		prefill2048) args=(-p 2048 -n 0 -r 1) ;;
		decode) args=(-p 0 -n 32 -d 128 -r 2) ;;
		esac
		r=$("$LLAMA_BENCH" -m "$f" -t "$t" "${args[@]}" -o json 2>/dev/null | jq -r '.[0].avg_ts')
		record "$f" llama.cpp "$t" "$test" "${r:-0}"
	done
}

prebuilt() { # FILE THREADS
	local f=$1 t=$2 js
	js=$(cd "$nlc" && BENCH_RUNS=2 BENCH_DECODE16=0 node bench.mjs "$f" "$t")
	for test in $tests; do
		key=$test
		[ "$test" = decode ] && key=decode1
		record "$f" prebuilt "$t" "$test" "$(jq -r ".$key // 0" <<<"$js")"
	done
}

echo "== $(now) stream read"
"$bin/tensor.test" -test.run '^$' -test.bench 'StreamRead' -test.benchtime 5x | grep Benchmark
if [[ " $engines " == *" llama.cpp "* ]]; then
	"$LLAMA_BENCH" -m "$1" -p 0 -n 1 -r 1 -o json 2>/dev/null | jq -c '.[0] | {build_commit, build_number, cpu_info, backends, flash_attn, n_batch, n_ubatch, type_k}'
fi
for r in $(seq "$rounds"); do
	for f in "$@"; do
		for t in $threads; do
			for e in $engines; do
				echo "== $(now) round $r $e $(basename "$f") threads=$t"
				kv=
				[[ $e == tandem*@* ]] && kv=${e#*@}
				case ${e%@*} in
				tandem) tandem "$f" "$t" "$bin" "$e" "$kv" ;;
				tandem:*) e0=${e%@*} && tandem "$f" "$t" "$bin/${e0#tandem:}" "$e" "$kv" ;;
				llama.cpp) llamacpp "$f" "$t" ;;
				prebuilt) prebuilt "$f" "$t" ;;
				*) echo "$0: unknown engine $e" >&2 && exit 2 ;;
				esac
			done
		done
	done
done
echo "== $(now) stream read"
"$bin/tensor.test" -test.run '^$' -test.bench 'StreamRead' -test.benchtime 5x | grep Benchmark
