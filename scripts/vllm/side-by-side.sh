#!/usr/bin/env bash
# Tandem against vLLM's CPU backend on one model directory, alternated in one
# window: prefill throughput at 128 and 2,048 prompt tokens, single-stream
# decode, aggregate decode at 16 streams (tandem bench with both servers as
# targets, the order alternating each round), then vLLM's own client
# (vllm bench serve) against each server at the same request rate, in the
# order Tandem, vLLM, Tandem, vLLM. Prints a Markdown table; the raw results
# stay in the output directory.
#
#   usage: flock /tmp/tandem-bench.lock bash scripts/vllm/side-by-side.sh [SHAPE] [THREADS] [OUTDIR]
#
# SHAPE is a `tandem model init --shape` (default smollm2-135m; vLLM's CPU
# attention needs a head size of 32 or more), THREADS the compute threads of
# each server (default 2: Tandem's --threads, vLLM's OMP_NUM_THREADS with
# VLLM_CPU_OMP_THREADS_BIND=nobind), OUTDIR where results go (default a new
# temporary directory). Needs the environment scripts/vllm/install.sh builds.
# Both servers stay up the whole run; only one computes at a time.
set -euo pipefail

shape="${1:-smollm2-135m}"
threads="${2:-2}"
out="${3:-$(mktemp -d -t tandem-vs-vllm.XXXXXX)}"
mkdir -p "$out"
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${TANDEM_VLLM_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/vllm-env}"
[ -x "$venv/bin/vllm" ] || { echo "side-by-side: no vLLM environment at $venv: run bash scripts/vllm/install.sh" >&2; exit 1; }
log() { echo "side-by-side: $*" >&2; }

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
  sleep 2
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_healthy() { # URL NAME LOG
  for _ in $(seq 1200); do
    curl -sf "$1/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  log "$2 not healthy after 10 minutes; its log:"; tail -50 "$3" >&2; exit 1
}

log "building tandem"
(cd "$root" && go build -o "$out/tandem" ./cmd/tandem)
model="$out/model-$shape"
[ -f "$model/config.json" ] || "$out/tandem" model init --shape "$shape" --out "$model" >&2

cpu_env=(VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS="$threads"
  VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1)
vport="$(free_port)"; tport="$(free_port)"
log "starting vllm serve on :$vport and tandem serve on :$tport ($threads threads each)"
setsid env "${cpu_env[@]}" "$venv/bin/vllm" serve "$model" --enforce-eager --dtype bfloat16 --block-size 32 \
  --max-model-len 4096 --served-model-name tiny --host 127.0.0.1 --port "$vport" >"$out/vllm.log" 2>&1 &
pids+=($!)
setsid "$out/tandem" serve --model "$model" --served-model-name tiny --threads "$threads" \
  --host 127.0.0.1 --port "$tport" >"$out/tandem.log" 2>&1 &
pids+=($!)
wait_healthy "http://127.0.0.1:$tport" tandem "$out/tandem.log"
wait_healthy "http://127.0.0.1:$vport" vllm "$out/vllm.log"
date -u +"side-by-side: window starts %FT%TZ" >&2
uptime >&2

bench() { # NAME FLAGS...
  local name="$1"; shift
  log "tandem bench: $name"
  "$out/tandem" bench --target "tandem=http://127.0.0.1:$tport" --target "vllm=http://127.0.0.1:$vport" \
    --model tiny --tokenizer "$model" --rounds 2 --progress 0 --seed "$RANDOM" --json "$out/$name.json" "$@" >"$out/$name.txt" 2>&1
}
bench prefill-128 --prompt-tokens 128 --max-tokens 1 --concurrency 1 --requests 8
bench prefill-2048 --prompt-tokens 2048 --max-tokens 1 --concurrency 1 --requests 3
bench decode-1 --prompt-tokens 128 --max-tokens 128 --concurrency 1 --requests 2
bench decode-16 --prompt-tokens 128 --max-tokens 64 --concurrency 16 --requests 16

rate=1
for round in 1 2; do
  for server in tandem vllm; do
    port="$tport"; [ "$server" = vllm ] && port="$vport"
    log "vllm bench serve against $server, round $round"
    env "${cpu_env[@]}" "$venv/bin/vllm" bench serve --backend vllm --base-url "http://127.0.0.1:$port" \
      --model tiny --tokenizer "$model" --dataset-name random --random-input-len 128 --random-output-len 32 \
      --num-prompts 12 --request-rate "$rate" --ignore-eos --seed "$round" --disable-tqdm \
      --save-result --result-filename "$out/vllm-bench-$server-$round.json" >"$out/vllm-bench-$server-$round.txt" 2>&1
  done
done
date -u +"side-by-side: window ends %FT%TZ" >&2
uptime >&2

python3 - "$out" "$shape" "$threads" "$rate" <<'PY'
import json, sys, statistics
out, shape, threads, rate = sys.argv[1:]
def tb(name):
    d = json.load(open(f"{out}/{name}.json"))
    return {r["target"]: r for r in d["results"]}
rows = []
for name, label in [("prefill-128", "prefill, 128 tokens (tokens/s)"), ("prefill-2048", "prefill, 2,048 tokens (tokens/s)")]:
    r = tb(name)
    n = int(name.split("-")[1])
    rows.append((label, *(n / (r[t]["ttft"]["p50_ms"] / 1000) for t in ("tandem", "vllm"))))
r = tb("decode-1")
rows.append(("single-stream decode (tokens/s, 1000/median TPOT)", *(1000 / r[t]["tpot"]["p50_ms"] for t in ("tandem", "vllm"))))
r = tb("decode-16")
rows.append(("16 streams: aggregate decode (tokens/s, 16×1000/median TPOT)", *(16000 / r[t]["tpot"]["p50_ms"] for t in ("tandem", "vllm"))))
rows.append(("16 streams: output throughput (tokens/s, prefill included)", *(r[t]["output_throughput"] for t in ("tandem", "vllm"))))
vb = {s: [json.load(open(f"{out}/vllm-bench-{s}-{i}.json")) for i in (1, 2)] for s in ("tandem", "vllm")}
for key, label in [("median_ttft_ms", "median TTFT (ms)"), ("median_tpot_ms", "median TPOT (ms)"), ("output_throughput", "output throughput (tokens/s)")]:
    rows.append((f"vllm bench serve at {rate} req/s: {label}", *(statistics.mean(x[key] for x in vb[s]) for s in ("tandem", "vllm"))))
failed = {s: sum(x["failed"] for x in vb[s]) for s in vb}
print(f"| {shape}, {threads} threads each | Tandem | vLLM CPU | Tandem / vLLM |")
print("|---|---|---|---|")
for label, t, v in rows:
    print(f"| {label} | {t:.1f} | {v:.1f} | {t / v:.2f} |")
print(f"\nvllm bench serve failures: Tandem {failed['tandem']}, vLLM {failed['vllm']}; results in {out}")
PY
