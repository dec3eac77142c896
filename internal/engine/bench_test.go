package engine

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/sample"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// cpuTime returns the CPU time (user + system) the process has used so
// far: the machine is shared, so tokens per CPU second are reported next to
// wall-clock rates.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStreams measures aggregate decode throughput of the whole engine
// (scheduler, model, sampling, detokenization, events) on the smollm2-135m
// shape in bf16 with 2 threads: N concurrent requests of a 64-token prompt
// and 128 output tokens each. TANDEM_BENCH_MODEL names an existing model
// directory; otherwise one is written to a temporary directory.
func BenchmarkStreams(b *testing.B) {
	dir := os.Getenv("TANDEM_BENCH_MODEL")
	if dir == "" {
		dir = b.TempDir()
		if _, err := modelinit.Init(dir, "smollm2-135m", "bf16", 1); err != nil {
			b.Fatal(err)
		}
	}
	pool := tensor.NewPool(2)
	defer pool.Close()
	m, err := model.Load(dir, pool)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	tok, err := tokenizer.Load(dir)
	if err != nil {
		b.Fatal(err)
	}
	// TANDEM_BENCH_KV lists KV cache dtypes to compare in one run
	// (--kv-cache-dtype values, comma-separated); default: the model's.
	kvs := []string{"auto"}
	if v := os.Getenv("TANDEM_BENCH_KV"); v != "" {
		kvs = strings.Split(v, ",")
	}
	for _, n := range []int{1, 4, 16} {
		for _, mode := range []string{"greedy", "sampled"} {
			for _, kv := range kvs {
				name := fmt.Sprintf("streams=%d/%s", n, mode)
				if len(kvs) > 1 {
					name += "/kv=" + kv
				}
				b.Run(name, func(b *testing.B) { benchStreams(b, m, tok, n, mode, kv) })
			}
		}
	}
}

// benchStreams runs n concurrent requests per iteration (see
// BenchmarkStreams).
func benchStreams(b *testing.B, m *model.Model, tok *tokenizer.Tokenizer, n int, mode, kv string) {
	e, err := New(Config{Model: m, Tokenizer: tok, NumBlocks: 256, KVCacheDType: kv,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Shutdown(b.Context())
	const promptLen, outLen = 64, 128
	rng := rand.New(rand.NewPCG(1, 2))
	var tokens int
	var decodeTime, decodeCPU time.Duration
	b.ResetTimer()
	for range b.N {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstAll time.Time
		var firstCPU time.Duration
		for range n {
			prompt := make([]int32, promptLen)
			for i := range prompt {
				prompt[i] = int32(10 + rng.IntN(40000))
			}
			p := sample.Params{MaxTokens: outLen, IgnoreEOS: true, Logprobs: -1}
			if mode == "sampled" {
				p.Temperature, p.TopP, p.Seed, p.HasSeed = 1, 0.95, rng.Uint64(), true
			}
			h, err := e.Submit(b.Context(), &Request{Prompt: prompt, Params: p})
			if err != nil {
				b.Fatal(err)
			}
			wg.Go(func() {
				got, first, cpu := 0, time.Time{}, time.Duration(0)
				for ev := range h.Events {
					if got == 0 && len(ev.Tokens) > 0 {
						first, cpu = time.Now(), cpuTime()
					}
					got += len(ev.Tokens)
				}
				mu.Lock()
				tokens += got
				if first.After(firstAll) {
					firstAll, firstCPU = first, cpu
				}
				mu.Unlock()
			})
		}
		wg.Wait()
		// Decode time: from the moment every stream has its first
		// token (all prefills done) to the end.
		decodeTime += time.Since(firstAll)
		decodeCPU += cpuTime() - firstCPU
	}
	b.ReportMetric(float64(tokens-n*b.N)/decodeTime.Seconds(), "decode-tok/s")
	if decodeCPU > 0 {
		b.ReportMetric(float64(tokens-n*b.N)/decodeCPU.Seconds(), "decode-tok/cpu-s")
	}
}
