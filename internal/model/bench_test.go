package model

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/tensor"
)

var (
	benchOnce sync.Once
	benchDir  string
	benchErr  error
	benchTemp string
)

// benchModel returns a directory holding a random smollm2-135m bf16 model,
// written once per test binary run. TANDEM_BENCH_MODEL names an existing
// model directory to use instead (handy when profiling repeatedly).
func benchModel(b *testing.B) string {
	b.Helper()
	benchOnce.Do(func() {
		if d := os.Getenv("TANDEM_BENCH_MODEL"); d != "" {
			benchDir = d
			return
		}
		benchTemp, benchErr = os.MkdirTemp("", "tandem-bench-model-")
		if benchErr != nil {
			return
		}
		spec, err := modelinit.Shape(modelinit.ShapeSmolLM2135M, "bf16")
		if err != nil {
			benchErr = err
			return
		}
		benchDir = benchTemp
		benchErr = modelinit.Write(benchDir, spec, 1)
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return benchDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if benchTemp != "" {
		os.RemoveAll(benchTemp)
	}
	os.Exit(code)
}

// cpuTime returns the CPU time (user + system) the process has used so
// far. The machine is shared, so benchmarks report tokens per CPU second
// next to wall-clock tok/s: it is far less sensitive to neighbours.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportRates(b *testing.B, tokens int, cpu time.Duration) {
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tok/s")
	if cpu > 0 {
		b.ReportMetric(float64(tokens)/cpu.Seconds(), "tok/cpu-s")
	}
}

// runBench runs f as the sub-benchmark threads=N, or threads=N/isa=X for
// every kernel ISA listed in TANDEM_BENCH_ISAS (comma-separated, e.g.
// "avx512bf16,avx512"), which compares kernel sets within one run. An
// entry may name the quantized kernels too, as TANDEM_KERNELS does
// ("avx512bf16/avx2", "avx512bf16/avx512vnni/avx2,q6_k=avx512vnni": a
// format=kernels part after a comma belongs to the entry before it).
func runBench(b *testing.B, threads int, f func(b *testing.B)) {
	name := fmt.Sprintf("threads=%d", threads)
	isas := os.Getenv("TANDEM_BENCH_ISAS")
	if isas == "" {
		b.Run(name, f)
		return
	}
	def := tensor.ISA()
	defer func() { _ = tensor.SetISA(def) }()
	for _, isa := range benchISAs(isas) {
		b.Run(name+"/isa="+isa, func(b *testing.B) {
			if _, err := tensor.Calibrate(tensor.CalibrateConfig{Override: isa}); err != nil {
				b.Fatal(err)
			}
			f(b)
		})
	}
}

// benchISAs splits TANDEM_BENCH_ISAS into its entries: at the commas,
// except before a format=kernels part (no "/"), which continues the entry
// before it.
func benchISAs(v string) []string {
	var out []string
	for e := range strings.SplitSeq(v, ",") {
		if len(out) > 0 && strings.Contains(e, "=") && !strings.Contains(e, "/") {
			out[len(out)-1] += "," + e
			continue
		}
		out = append(out, e)
	}
	return out
}

// benchLayout is m's KV layout for the benchmarks, 16 slots a block: the
// model's default element type (--kv-cache-dtype auto), or the one
// TANDEM_BENCH_KV names as `tandem serve --kv-cache-dtype` takes it
// ("bfloat16", "float32").
func benchLayout(b *testing.B, m *Model) kvlayout.Layout {
	b.Helper()
	dt, set, err := kvlayout.ParseElemType(os.Getenv("TANDEM_BENCH_KV"))
	if err != nil {
		b.Fatalf("TANDEM_BENCH_KV: %v", err)
	}
	if !set {
		return m.KVLayout(16)
	}
	return m.KVLayoutOf(16, dt)
}

func loadBench(b *testing.B, threads int) *Model {
	b.Helper()
	pool := tensor.NewPool(threads)
	b.Cleanup(pool.Close)
	m, err := Load(benchModel(b), pool)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}

// BenchmarkPrefill runs a 128-token prompt through the smollm2-135m shape
// (bf16) in one Forward call, asking for the last token's logits.
func BenchmarkPrefill(b *testing.B) {
	const n = 128
	for _, threads := range []int{1, 2} {
		runBench(b, threads, func(b *testing.B) {
			m := loadBench(b, threads)
			layout := benchLayout(b, m)
			kv, blocks := contiguous(layout, n)
			tokens := make([]int32, n)
			for i := range tokens {
				tokens[i] = int32((i*7919 + 13) % m.VocabSize())
			}
			seqs := []Seq{{Tokens: tokens, Blocks: blocks, Logits: []int{n - 1}}}
			if _, err := m.Forward(seqs, kv, layout); err != nil {
				b.Fatal(err)
			}
			cpu0 := cpuTime()
			b.ResetTimer()
			for b.Loop() {
				if _, err := m.Forward(seqs, kv, layout); err != nil {
					b.Fatal(err)
				}
			}
			reportRates(b, n*b.N, cpuTime()-cpu0)
		})
	}
}

// BenchmarkPrefillLong prefills prompts of 512 to 8192 tokens through the
// smollm2-135m shape (bf16, bf16 KV cache), asking for the last token's
// logits, in chunks of at most prefillChunk tokens per Forward call (the
// engine's default --max-num-batched-tokens): attention's share grows with
// the square of the length. TANDEM_BENCH_TOKENS (comma-separated) picks
// the lengths, TANDEM_BENCH_CHUNK another chunk size.
func BenchmarkPrefillLong(b *testing.B) {
	prefillChunk := 2048
	if env := os.Getenv("TANDEM_BENCH_CHUNK"); env != "" {
		n, err := strconv.Atoi(env)
		if err != nil || n <= 0 {
			b.Fatalf("TANDEM_BENCH_CHUNK: bad chunk %q", env)
		}
		prefillChunk = n
	}
	lengths := []int{512, 1024, 2048, 4096, 8192}
	if env := os.Getenv("TANDEM_BENCH_TOKENS"); env != "" {
		lengths = lengths[:0]
		for f := range strings.SplitSeq(env, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				b.Fatalf("TANDEM_BENCH_TOKENS: bad length %q", f)
			}
			lengths = append(lengths, n)
		}
	}
	for _, n := range lengths {
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			for _, threads := range []int{1, 2} {
				runBench(b, threads, func(b *testing.B) {
					m := loadBench(b, threads)
					if n > m.cfg.MaxModelLen() {
						b.Skipf("model has %d positions", m.cfg.MaxModelLen())
					}
					layout := benchLayout(b, m)
					kv, blocks := contiguous(layout, n)
					tokens := make([]int32, n)
					for i := range tokens {
						tokens[i] = int32((i*7919 + 13) % m.VocabSize())
					}
					prefill := func() {
						for pos := 0; pos < n; pos += prefillChunk {
							end := min(pos+prefillChunk, n)
							seqs := []Seq{{Tokens: tokens[pos:end], Pos: pos, Blocks: blocks, Logits: []int{end - pos - 1}}}
							if _, err := m.Forward(seqs, kv, layout); err != nil {
								b.Fatal(err)
							}
						}
					}
					prefill()
					cpu0 := cpuTime()
					b.ResetTimer()
					for b.Loop() {
						prefill()
					}
					reportRates(b, n*b.N, cpuTime()-cpu0)
				})
			}
		})
	}
}

// BenchmarkDecode decodes one token per Forward call for a single
// sequence with 128 to 255 tokens of context.
func BenchmarkDecode(b *testing.B) {
	const ctx = 128
	for _, threads := range []int{1, 2} {
		runBench(b, threads, func(b *testing.B) {
			m := loadBench(b, threads)
			layout := benchLayout(b, m)
			kv, blocks := contiguous(layout, 2*ctx)
			prompt := make([]int32, ctx)
			for i := range prompt {
				prompt[i] = int32((i*7919 + 13) % m.VocabSize())
			}
			if _, err := m.Forward([]Seq{{Tokens: prompt, Blocks: blocks, Logits: []int{ctx - 1}}}, kv, layout); err != nil {
				b.Fatal(err)
			}
			tok := []int32{42}
			i := 0
			var each []time.Duration
			cpu0 := cpuTime()
			b.ResetTimer()
			for b.Loop() {
				t0 := time.Now()
				seqs := []Seq{{Tokens: tok, Pos: ctx + i%ctx, Blocks: blocks, Logits: []int{0}}}
				out, err := m.Forward(seqs, kv, layout)
				if err != nil {
					b.Fatal(err)
				}
				tok[0] = argmax(out[0])
				each = append(each, time.Since(t0))
				i++
			}
			reportRates(b, b.N, cpuTime()-cpu0)
			reportLowTimes(b, each)
		})
	}
}

// reportLowTimes reports the fastest and the 10th-percentile time of one
// token (ms/tok-min, ms/tok-p10): on a shared host they are what a token
// costs when no thread of it was descheduled, which the mean is not.
func reportLowTimes(b *testing.B, each []time.Duration) {
	if len(each) == 0 {
		return
	}
	slices.Sort(each)
	ms := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }
	b.ReportMetric(ms(each[0]), "ms/tok-min")
	b.ReportMetric(ms(each[(len(each)-1)/10]), "ms/tok-p10")
}

// BenchmarkDecodeBatch16 is batched decode as the serving loop runs it: 16
// sequences, each with a 64-token prompt prefilled first, then one Forward
// per step carrying one new token of every sequence (context 64 to 127).
// tok/s counts all 16 tokens of a step.
func BenchmarkDecodeBatch16(b *testing.B) {
	const nseq, ctx = 16, 64
	for _, threads := range []int{1, 2} {
		runBench(b, threads, func(b *testing.B) {
			m := loadBench(b, threads)
			layout := benchLayout(b, m)
			kv, blocks := contiguous(layout, nseq*2*ctx)
			per := len(blocks) / nseq
			seqs := make([]Seq, nseq)
			for s := range seqs {
				prompt := make([]int32, ctx)
				for i := range prompt {
					prompt[i] = int32((i*7919 + s*104729 + 13) % m.VocabSize())
				}
				seqs[s] = Seq{Tokens: prompt, Blocks: blocks[s*per : (s+1)*per], Logits: []int{ctx - 1}}
			}
			if _, err := m.Forward(seqs, kv, layout); err != nil {
				b.Fatal(err)
			}
			toks := make([]int32, nseq)
			for s := range seqs {
				toks[s] = int32(42 + s)
				seqs[s].Tokens = toks[s : s+1]
				seqs[s].Logits = []int{0}
			}
			i := 0
			cpu0 := cpuTime()
			b.ResetTimer()
			for b.Loop() {
				for s := range seqs {
					seqs[s].Pos = ctx + i%ctx
				}
				out, err := m.Forward(seqs, kv, layout)
				if err != nil {
					b.Fatal(err)
				}
				for s := range seqs {
					toks[s] = argmax(out[s])
				}
				i++
			}
			reportRates(b, nseq*b.N, cpuTime()-cpu0)
		})
	}
}
