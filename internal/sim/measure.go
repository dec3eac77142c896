package sim

import (
	"fmt"
	"runtime"
	"slices"
	"time"
	"unsafe"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/model"
)

// MeasureConfig bounds a profiling run.
type MeasureConfig struct {
	// Name, Machine and Threads are recorded in the profile.
	Name, Machine string
	Threads       int
	// BlockSize and KVDType lay out the KV cache as the engine would
	// (default 16 and the model's own).
	BlockSize int
	KVDType   kvlayout.ElemType
	// PrefillTokens, Batches and Contexts are the grid (defaults below,
	// cut at the model's max len); MaxKVBytes skips decode points whose KV
	// would not fit (default 1 GiB).
	PrefillTokens, Batches, Contexts []int
	MaxKVBytes                       int64
	// Budget bounds the whole run (default 90s): prompt steps get 40% of
	// it, decode steps the rest; points are measured from small to large,
	// and once a part's time is spent its remaining points are skipped
	// (the time model extrapolates beyond the grid). Each point runs once
	// to warm up, then until MinTime (default 250ms) and MinReps (default
	// 5) are reached — but no more runs once 8·MinTime is spent —
	// at most MaxReps (default 20) times, and the fastest run is kept: on
	// a shared machine other work only ever adds time, so the minimum is
	// the least disturbed estimate of what this machine does. For the same
	// reason no point is kept above a larger step's time (monotone).
	Budget           time.Duration
	MinTime          time.Duration
	MinReps, MaxReps int
	// Progress, if set, is told about every measured point.
	Progress func(what string, d time.Duration)
}

// Default profiling grid.
var (
	DefaultPrefillTokens = []int{1, 16, 64, 128, 256, 512, 1024, 2048}
	DefaultBatches       = []int{1, 2, 4, 8, 16, 32, 64}
	DefaultContexts      = []int{16, 128, 512, 2048}
)

// Measure profiles m's real forward pass on this machine: a prompt step of
// each PrefillTokens size, and a decode step of each batch size at each
// context, into a fresh KV pool (its contents do not change the time).
func Measure(m *model.Model, cfg MeasureConfig) (*Profile, error) {
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.KVDType == 0 {
		cfg.KVDType = m.KVDType()
	}
	cfg.PrefillTokens = cmpSlice(cfg.PrefillTokens, DefaultPrefillTokens)
	cfg.Batches = cmpSlice(cfg.Batches, DefaultBatches)
	cfg.Contexts = cmpSlice(cfg.Contexts, DefaultContexts)
	if cfg.MaxKVBytes == 0 {
		cfg.MaxKVBytes = 1 << 30
	}
	if cfg.Budget == 0 {
		cfg.Budget = 90 * time.Second
	}
	if cfg.MinTime == 0 {
		cfg.MinTime = 250 * time.Millisecond
	}
	cfg.MinReps, cfg.MaxReps = cmpOr(cfg.MinReps, 5), cmpOr(cfg.MaxReps, 20)
	if cfg.Progress == nil {
		cfg.Progress = func(string, time.Duration) {}
	}
	layout := m.KVLayoutOf(cfg.BlockSize, cfg.KVDType)
	maxLen := m.MaxModelLen()
	blockBytes := int64(layout.BlockBytes())
	blocksFor := func(n int) int { return (n + cfg.BlockSize - 1) / cfg.BlockSize }

	var prefill []int
	for _, n := range cfg.PrefillTokens {
		if n >= 1 && n <= maxLen {
			prefill = append(prefill, n)
		}
	}
	type dpoint struct{ b, c int }
	var decode []dpoint
	for _, b := range cfg.Batches {
		for _, c := range cfg.Contexts {
			if b >= 1 && c >= 1 && c <= maxLen && int64(b*blocksFor(c))*blockBytes <= cfg.MaxKVBytes {
				decode = append(decode, dpoint{b, c})
			}
		}
	}
	// Smallest first, so a spent budget drops the largest points.
	slices.SortStableFunc(decode, func(x, y dpoint) int { return x.b*x.c - y.b*y.c })
	if len(prefill) == 0 || len(decode) == 0 {
		return nil, fmt.Errorf("sim: no profiling point fits the model's %d positions and %d bytes of KV", maxLen, cfg.MaxKVBytes)
	}
	need := blocksFor(slices.Max(prefill))
	for _, d := range decode {
		need = max(need, d.b*blocksFor(d.c))
	}
	// []uint64 backing keeps the pool 8-byte aligned, as f32 needs.
	words := make([]uint64, (int64(need)*blockBytes+7)/8)
	pool := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), int64(need)*blockBytes)

	vocab := int32(m.VocabSize())
	tokens := func(n int, salt int) []int32 {
		t := make([]int32, n)
		for i := range t {
			t[i] = int32(mix(uint64(i*7919+salt)) % uint64(vocab))
		}
		return t
	}
	blockTable := func(first, n int) []int32 {
		b := make([]int32, n)
		for i := range b {
			b[i] = int32(first + i)
		}
		return b
	}
	start := time.Now()
	deadline := start.Add(cfg.Budget * 4 / 10)
	run := func(seqs []model.Seq) (time.Duration, error) {
		var times []time.Duration
		if _, err := m.Forward(seqs, pool, layout); err != nil { // warm-up
			return 0, err
		}
		var total time.Duration
		for len(times) == 0 || len(times) < cfg.MaxReps && (total < cfg.MinTime || len(times) < cfg.MinReps && total < 8*cfg.MinTime) {
			start := time.Now()
			if _, err := m.Forward(seqs, pool, layout); err != nil {
				return 0, err
			}
			d := time.Since(start)
			times, total = append(times, d), total+d
			if time.Now().After(deadline) {
				break
			}
		}
		return slices.Min(times), nil
	}

	p := &Profile{
		Version: ProfileVersion, Model: cfg.Name, Fingerprint: m.Fingerprint(), DType: m.DType().String(),
		KVDType: layout.DType.String(), Machine: cfg.Machine, Threads: cfg.Threads, Created: time.Now().UTC().Format(time.RFC3339),
	}
	if p.Machine == "" {
		p.Machine = runtime.GOOS + "/" + runtime.GOARCH
	}
	for _, n := range prefill {
		if time.Now().After(deadline) && len(p.Prefill) >= 2 {
			break
		}
		d, err := run([]model.Seq{{Tokens: tokens(n, n), Pos: 0, Blocks: blockTable(0, blocksFor(n)), Logits: []int{n - 1}}})
		if err != nil {
			return nil, err
		}
		p.Prefill = append(p.Prefill, PrefillPoint{Tokens: n, Seconds: d.Seconds()})
		cfg.Progress(fmt.Sprintf("prefill %d tokens", n), d)
	}
	deadline = start.Add(cfg.Budget)
	for _, dp := range decode {
		if time.Now().After(deadline) && len(p.Decode) >= 2 {
			break
		}
		per := blocksFor(dp.c)
		seqs := make([]model.Seq, dp.b)
		for i := range seqs {
			seqs[i] = model.Seq{Tokens: tokens(1, i), Pos: dp.c - 1, Blocks: blockTable(i*per, per), Logits: []int{0}}
		}
		d, err := run(seqs)
		if err != nil {
			return nil, err
		}
		p.Decode = append(p.Decode, DecodePoint{Batch: dp.b, Context: dp.c, Seconds: d.Seconds()})
		cfg.Progress(fmt.Sprintf("decode batch %d context %d", dp.b, dp.c), d)
	}
	monotone(p)
	if err := p.prepare(); err != nil {
		return nil, err
	}
	return p, nil
}

// monotone lowers every point to the fastest time measured for a step at
// least as large (more prompt tokens; a larger batch or a longer context):
// a larger step never takes less time, and other work on the machine only
// ever adds time, so a point above a larger one was disturbed.
func monotone(p *Profile) {
	slices.SortFunc(p.Prefill, func(a, b PrefillPoint) int { return a.Tokens - b.Tokens })
	for i := len(p.Prefill) - 2; i >= 0; i-- {
		p.Prefill[i].Seconds = min(p.Prefill[i].Seconds, p.Prefill[i+1].Seconds)
	}
	for changed := true; changed; {
		changed = false
		for i := range p.Decode {
			for _, q := range p.Decode {
				a := &p.Decode[i]
				if q.Batch >= a.Batch && q.Context >= a.Context && q.Seconds < a.Seconds {
					a.Seconds, changed = q.Seconds, true
				}
			}
		}
	}
}

func cmpSlice(v, def []int) []int {
	if len(v) == 0 {
		return def
	}
	return v
}
