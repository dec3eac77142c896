package sim

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/model"
)

// newTestModel is a simulated model that records its sleeps instead of
// sleeping.
func newTestModel(t *testing.T, cfg Config) (*Model, *[]time.Duration) {
	t.Helper()
	var slept []time.Duration
	if cfg.Vocab == 0 {
		cfg.Vocab = 512
	}
	if cfg.MaxModelLen == 0 {
		cfg.MaxModelLen = 4096
	}
	if cfg.Time == nil {
		cfg.Time = Knobs{TTFT: 50 * time.Millisecond, ITL: 10 * time.Millisecond, PrefillPerToken: time.Millisecond}
	}
	cfg.Sleep = func(d time.Duration) { slept = append(slept, d) }
	cfg.Logger = slog.New(slog.DiscardHandler)
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, &slept
}

// testPool is a KV pool of n blocks laid out as l.
func testPool(l kvlayout.Layout, n int) []byte { return make([]byte, n*l.BlockBytes()) }

func prompt(n int, salt uint64) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(mix(uint64(i)+salt<<20) % 500)
	}
	return p
}

func blocks(first, n int) []int32 {
	b := make([]int32, n)
	for i := range b {
		b[i] = int32(first + i)
	}
	return b
}

// prefill runs a whole prompt in one step and returns the sampled row.
func prefill(t *testing.T, m *Model, pool []byte, l kvlayout.Layout, p, bt []int32) []float32 {
	t.Helper()
	out, err := m.Forward([]model.Seq{{Tokens: p, Blocks: bt, Logits: []int{len(p) - 1}, Prompt: p}}, pool, l)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Clone(out[0])
}

func TestPatternCheck(t *testing.T) {
	for _, dt := range []kvlayout.ElemType{kvlayout.BF16, kvlayout.F32} {
		l := kvlayout.Layout{BlockSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8, DType: dt}
		p := prompt(10, 1)
		bt := []int32{3, 0, 5}
		fill := func() []byte {
			pool := testPool(l, 6)
			for pos, tok := range p {
				writeToken(pool, l, bt, tok, pos)
			}
			return pool
		}
		at := func(i int) int32 { return p[i] }
		t.Run(dt.String()+": the pattern written is the pattern checked", func(t *testing.T) {
			if err := checkRange(fill(), l, bt, at, 0, len(p)); err != nil {
				t.Fatal(err)
			}
		})
		t.Run(dt.String()+": a flipped byte names its block", func(t *testing.T) {
			pool := fill()
			pool[l.Offset(0, 1, 1, 2)*l.ElemBytes()+3] ^= 1 // block 0 is the second in the table: positions 4..7
			err := checkRange(pool, l, bt, at, 0, len(p))
			if err == nil || !slices.Equal(err.Blocks, []int32{0}) || err.Pos != 6 || err.Layer != 1 || err.KV != 1 {
				t.Fatalf("got %v, want block 0 at position 6, layer 1, V", err)
			}
		})
		t.Run(dt.String()+": blocks swapped in the table fail", func(t *testing.T) {
			err := checkRange(fill(), l, []int32{0, 3, 5}, at, 0, len(p))
			if err == nil || !slices.Equal(err.Blocks, []int32{0, 3}) {
				t.Fatalf("got %v, want blocks 0 and 3", err)
			}
		})
		t.Run(dt.String()+": other tokens or positions fail, zeros fail", func(t *testing.T) {
			q := slices.Clone(p)
			q[9]++
			if err := checkRange(fill(), l, bt, func(i int) int32 { return q[i] }, 0, len(p)); err == nil || err.Pos != 9 {
				t.Errorf("a changed token: %v", err)
			}
			if err := checkRange(fill(), l, bt, func(i int) int32 { return p[(i+1)%len(p)] }, 0, 4); err == nil {
				t.Error("shifted positions passed")
			}
			if err := checkRange(testPool(l, 6), l, bt, at, 0, len(p)); err == nil || len(err.Blocks) != 3 {
				t.Errorf("fresh memory: %v", err)
			}
		})
	}
}

func TestForwardIsBatchInvariantAndDeterministic(t *testing.T) {
	m, _ := newTestModel(t, Config{Seed: 7})
	l := m.KVLayout(16)
	pool := testPool(l, 64)
	a, b := prompt(40, 1), prompt(23, 2)
	alone := prefill(t, m, pool, l, a, blocks(0, 3))

	// The same prompt in 2 chunks, batched with another sequence, on other
	// blocks: the same logits.
	if _, err := m.Forward([]model.Seq{{Tokens: a[:30], Blocks: blocks(10, 3), Prompt: a}}, pool, l); err != nil {
		t.Fatal(err)
	}
	out, err := m.Forward([]model.Seq{
		{Tokens: b, Blocks: blocks(20, 2), Logits: []int{len(b) - 1}, Prompt: b},
		{Tokens: a[30:], Pos: 30, Blocks: blocks(10, 3), Logits: []int{9}, Prompt: a},
	}, pool, l)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out[1], alone) {
		t.Error("logits differ between a prompt alone and chunked in a batch")
	}
	if slices.Equal(out[0], alone) {
		t.Error("two different prompts got the same logits")
	}
	other, _ := newTestModel(t, Config{Seed: 8})
	if slices.Equal(prefill(t, other, testPool(l, 64), l, a, blocks(0, 3)), alone) {
		t.Error("another seed gave the same logits")
	}
	// Greedy picks a text token (all ids are choices here) and logits
	// are the documented shape.
	if slices.Max(alone) != 0 || slices.Min(alone) != -511.0/20 {
		t.Errorf("logits range [%v, %v], want [-511/20, 0]", slices.Min(alone), slices.Max(alone))
	}
}

func TestForwardChoicesAndEOS(t *testing.T) {
	choices := []int32{5, 6, 7, 9}
	m, _ := newTestModel(t, Config{Vocab: 16, Choices: choices, EOS: []int32{2}, MeanOutputLen: 4})
	l := m.KVLayout(16)
	pool := testPool(l, 64)
	ends := 0
	for i := range 200 {
		p := []int32{int32(5 + i%4), int32(i % 16), 7}
		row := prefill(t, m, pool, l, p, blocks(i%60, 1))
		best := int32(slices.Index(row, slices.Max(row)))
		switch {
		case best == 2:
			ends++
		case !slices.Contains(choices, best):
			t.Fatalf("greedy token %d is neither a choice nor EOS", best)
		}
	}
	if ends < 20 || ends > 90 { // 200 draws with p = 1/4: 50 ± 6
		t.Errorf("EOS won %d of 200 times with a mean output length of 4", ends)
	}
}

func TestForwardChecksHistoryAtTheLastPromptToken(t *testing.T) {
	m, _ := newTestModel(t, Config{})
	l := m.KVLayout(16)
	pool := testPool(l, 64)
	p := prompt(50, 3)
	bt := blocks(0, 4)
	// Another engine (a prefill) wrote positions [0, 49): copy them as a
	// pull would.
	src, _ := newTestModel(t, Config{})
	if _, err := src.Forward([]model.Seq{{Tokens: p, Blocks: bt, Prompt: p}}, pool, l); err != nil {
		t.Fatal(err)
	}
	last := model.Seq{Tokens: p[49:], Pos: 49, Blocks: bt, Logits: []int{0}, Prompt: p}
	if _, err := m.Forward([]model.Seq{last}, pool, l); err != nil {
		t.Fatalf("intact history: %v", err)
	}
	pool[l.Offset(2, 0, 0, 5)*l.ElemBytes()] ^= 0x80
	other := model.Seq{Tokens: prompt(5, 4), Blocks: blocks(40, 1), Logits: []int{4}, Prompt: prompt(5, 4)}
	out, err := m.Forward([]model.Seq{other, last}, pool, l)
	var se model.SeqErrors
	if !errors.As(err, &se) || len(se) != 1 || se[1] == nil {
		t.Fatalf("error %v, want a model.SeqErrors for sequence 1 only", err)
	}
	var perr *PatternError
	if !errors.As(se[1], &perr) || !slices.Equal(perr.Blocks, []int32{2}) || perr.Pos != 37 {
		t.Errorf("sequence error %v, want block 2 at position 37", se[1])
	}
	if len(out[0]) != 512 {
		t.Error("the healthy sequence got no logits")
	}
	if s := m.Stats(); s.BadForwards != 1 || s.CheckedTokens != 98 {
		t.Errorf("stats %+v", s)
	}
}

func TestCheckLoadedKV(t *testing.T) {
	p := prompt(40, 5)
	bt := blocks(4, 3)
	setup := func(t *testing.T, f Faults) (*Model, []byte, kvlayout.Layout) {
		m, _ := newTestModel(t, Config{Faults: f, Speed: 2})
		l := m.KVLayout(16)
		pool := testPool(l, 8)
		if _, err := m.Forward([]model.Seq{{Tokens: p, Blocks: bt, Prompt: p}}, pool, l); err != nil {
			t.Fatal(err)
		}
		return m, pool, l
	}
	t.Run("an intact load passes, late by the KV delay over the speed", func(t *testing.T) {
		m, pool, l := setup(t, Faults{KVDelay: time.Second})
		if v := m.CheckLoadedKV(p[:39], bt, pool, l); v.Bad != nil || v.Delay != 500*time.Millisecond {
			t.Errorf("verdict %+v", v)
		}
	})
	t.Run("a damaged byte fails its block", func(t *testing.T) {
		m, pool, l := setup(t, Faults{})
		pool[l.Offset(5, 1, 0, 3)*l.ElemBytes()+1] ^= 4
		v := m.CheckLoadedKV(p[:39], bt, pool, l)
		if !slices.Equal(v.Bad, []int32{5}) || v.Err == nil || !strings.Contains(v.Err.Error(), "KV pattern check failed") {
			t.Errorf("verdict %+v", v)
		}
	})
	t.Run("--sim-kv-corrupt-rate damages the last loaded block, and the check sees it", func(t *testing.T) {
		m, pool, l := setup(t, Faults{KVCorruptRate: 1})
		if v := m.CheckLoadedKV(p[:39], bt, pool, l); !slices.Equal(v.Bad, []int32{6}) {
			t.Errorf("verdict %+v, want block 6 bad", v)
		}
		if s := m.Stats(); s.BadLoads != 1 || s.LoadsChecked != 1 {
			t.Errorf("stats %+v", s)
		}
	})
	t.Run("--sim-kv-fail-rate fails every loaded block", func(t *testing.T) {
		m, pool, l := setup(t, Faults{KVFailRate: 1})
		if v := m.CheckLoadedKV(p[:39], bt, pool, l); !slices.Equal(v.Bad, bt) || v.Err == nil {
			t.Errorf("verdict %+v", v)
		}
	})
}

func TestForwardSleepsTheModelsTime(t *testing.T) {
	m, slept := newTestModel(t, Config{Speed: 10})
	l := m.KVLayout(16)
	pool := testPool(l, 64)
	p := prompt(100, 6)
	prefill(t, m, pool, l, p, blocks(0, 7))
	if _, err := m.Forward([]model.Seq{
		{Tokens: p[:1], Pos: 100, Blocks: blocks(0, 7), Logits: []int{0}, Prompt: p, Output: p[:1]},
		{Tokens: p[:20], Blocks: blocks(10, 2), Logits: []int{19}, Prompt: p[:20]},
	}, pool, l); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{15 * time.Millisecond, 8 * time.Millisecond} // (50ms + 100·1ms)/10, (50ms + 20·1ms + 10ms)/10
	if !slices.Equal(*slept, want) {
		t.Errorf("slept %v, want %v", *slept, want)
	}
	if s := m.Stats(); s.SimulatedTime != 230*time.Millisecond || s.Steps != 2 || s.Tokens != 121 {
		t.Errorf("stats %+v", s)
	}
}

func TestFaults(t *testing.T) {
	t.Run("--sim-error-rate 1 fails every request at its last prompt token, not its decodes", func(t *testing.T) {
		m, _ := newTestModel(t, Config{Faults: Faults{ErrorRate: 1}})
		l := m.KVLayout(16)
		pool := testPool(l, 8)
		p := prompt(20, 7)
		_, err := m.Forward([]model.Seq{{Tokens: p[:10], Blocks: blocks(0, 2), Prompt: p}}, pool, l)
		if err != nil {
			t.Fatalf("a first chunk failed: %v", err)
		}
		_, err = m.Forward([]model.Seq{{Tokens: p[10:], Pos: 10, Blocks: blocks(0, 2), Logits: []int{9}, Prompt: p}}, pool, l)
		var se model.SeqErrors
		if !errors.As(err, &se) || !strings.Contains(se[0].Error(), "--sim-error-rate") {
			t.Fatalf("error %v", err)
		}
		_, err = m.Forward([]model.Seq{{Tokens: []int32{3}, Pos: 20, Blocks: blocks(0, 2), Logits: []int{0}, Prompt: p, Output: []int32{3}}}, pool, l)
		if err != nil {
			t.Errorf("a decode failed: %v", err)
		}
	})
	t.Run("--sim-crash-after 2 crashes when the third request starts", func(t *testing.T) {
		crashes := 0
		m, _ := newTestModel(t, Config{Faults: Faults{CrashAfter: 2, Crash: func() { crashes++ }}})
		l := m.KVLayout(16)
		pool := testPool(l, 8)
		for i := range 3 {
			if crashes != 0 {
				t.Fatalf("crashed after %d requests", i)
			}
			p := prompt(5, uint64(i))
			prefill(t, m, pool, l, p, blocks(i, 1))
		}
		if crashes != 1 {
			t.Errorf("%d crashes after 3 requests, want 1", crashes)
		}
	})
	t.Run("--sim-stall-every freezes the first step after each period", func(t *testing.T) {
		m, slept := newTestModel(t, Config{Time: Knobs{}, Faults: Faults{StallEvery: time.Nanosecond, StallFor: 3 * time.Second}})
		l := m.KVLayout(16)
		prefill(t, m, testPool(l, 8), l, prompt(5, 1), blocks(0, 1))
		if !slices.Equal(*slept, []time.Duration{3 * time.Second}) {
			t.Errorf("slept %v, want one 3s stall", *slept)
		}
	})
	t.Run("bad settings are refused", func(t *testing.T) {
		for _, f := range []Faults{{ErrorRate: 2}, {KVFailRate: -1}, {StallFor: -1}, {CrashAfter: -1}} {
			if _, err := New(Config{Vocab: 10, MaxModelLen: 10, Faults: f}); err == nil {
				t.Errorf("faults %+v accepted", f)
			}
		}
	})
}

// --kv-cache-dtype reaches a simulated engine's KV layout: float32 was
// turned into bf16 (F32 is the element type's zero value).
func TestKVCacheDType(t *testing.T) {
	for _, tc := range []struct {
		flag string
		want kvlayout.ElemType
	}{{"", kvlayout.BF16}, {"auto", kvlayout.BF16}, {"bfloat16", kvlayout.BF16}, {"float32", kvlayout.F32}} {
		m, err := New(Config{Vocab: 10, MaxModelLen: 10, KVCacheDType: tc.flag})
		if err != nil {
			t.Fatalf("%q: %v", tc.flag, err)
		}
		if got := m.KVLayout(16).DType; got != tc.want {
			t.Errorf("--kv-cache-dtype %q: KV layout %v; want %v", tc.flag, got, tc.want)
		}
		m.Close()
	}
	if _, err := New(Config{Vocab: 10, MaxModelLen: 10, KVCacheDType: "fp8"}); err == nil || !strings.Contains(err.Error(), "fp8") {
		t.Errorf("fp8: err %v; want a refusal naming it", err)
	}
}
