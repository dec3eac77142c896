package kvconnector

import (
	"slices"
	"strconv"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/testutil/loaded"
)

// gemmaShaped writes and loads a small Gemma 3 on the stories tokenizer's
// vocabulary: six layers, five local with a window of 32 and one global,
// so a hybrid pool has six groups of one layer.
func gemmaShaped(t *testing.T) *model.Model {
	return shaped(t, modelinit.Spec{
		ModelType: "gemma3_text", Hidden: 32, Layers: 6, Heads: 2, KVHeads: 1, HeadDim: 16,
		Intermediate: 48, MaxPositions: 4096, RMSNormEps: 1e-6, RopeTheta: 1e6,
		BOS: 1, EOS: 2, DType: "f32", Std: 0.15, Tied: true, SlidingWindow: 32,
		Gemma: modelinit.Gemma{Pattern: 6, LocalRopeTheta: 10000, QueryScalar: 16},
	})
}

// mistralShaped is a small Mistral whose two layers all have a window of
// 32: one sliding-window group of every layer.
func mistralShaped(t *testing.T) *model.Model {
	return shaped(t, modelinit.Spec{
		ModelType: "mistral", Hidden: 32, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 16,
		Intermediate: 48, MaxPositions: 4096, RMSNormEps: 1e-5, RopeTheta: 1e4,
		BOS: 1, EOS: 2, DType: "f32", Std: 0.15, SlidingWindow: 32,
	})
}

// shaped writes and loads spec with the stories tokenizer's vocabulary.
func shaped(t *testing.T, spec modelinit.Spec) *model.Model {
	t.Helper()
	spec.Vocab = loaded.Stories(t).Tokenizer.VocabSize()
	dir := t.TempDir()
	if err := modelinit.Write(dir, spec, 11); err != nil {
		t.Fatal(err)
	}
	pool := tensor.NewPool(1)
	t.Cleanup(pool.Close)
	m, err := model.Load(dir, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestHybridDisaggregatedMatchesColocated runs P/D between engines with
// hybrid KV-cache groups (a Gemma 3's full group and five sliding ones; a
// Mistral's one sliding group of every layer): remote_block_ids has one
// list per group, the sliding-window groups' clipped to their window's
// tail, the decode pulls at most those blocks (the bytes moved say so) and
// answers the tokens a colocated engine answers.
func TestHybridDisaggregatedMatchesColocated(t *testing.T) {
	for _, arch := range []struct {
		name    string
		model   func(*testing.T) *model.Model
		windows []int
	}{
		{"gemma3", gemmaShaped, []int{0, 32, 32, 32, 32, 32}},
		{"mistral", mistralShaped, []int{32}},
	} {
		g := arch.model(t)
		ref := newPD(t, pdOpts{fwd: g})
		for _, tr := range []kvxfer.Transport{kvxfer.TransportTCP, kvxfer.TransportShm} {
			p := newPD(t, pdOpts{role: RolePrefill, fwd: g, numBlocks: 512})
			d := newPD(t, pdOpts{role: RoleDecode, transport: tr, fwd: g, numBlocks: 512})
			if w := d.e.KVGroupWindows(); !slices.Equal(w, arch.windows) {
				t.Fatalf("%s: KV-cache group windows %v, want %v", arch.name, w, arch.windows)
			}
			layers := d.e.KVPool().Layout().Layers
			bb := d.e.KVPool().Layout().BlockBytes()
			for i, n := range []int{5, 17, 100, 300} {
				t.Run(arch.name+"/"+string(tr)+"/"+strconv.Itoa(n)+" prompt tokens", func(t *testing.T) {
					prompt := promptOf(uint64(100*i)+map[kvxfer.Transport]uint64{kvxfer.TransportTCP: 0, kvxfer.TransportShm: 1}[tr]*10000, n)
					want := run(t, ref.e, &engine.Request{Prompt: prompt, Params: greedy(12)})
					kv := prefill(t, p, prompt, greedy(12))
					ids := typed(t, kv).RemoteBlockIDs
					if len(ids) != len(arch.windows) {
						t.Fatalf("remote_block_ids has %d groups, want %d", len(ids), len(arch.windows))
					}
					nb := (n + 15) / 16
					sent := 0
					for grp, list := range ids {
						if want := nb - clipStart(arch.windows[grp], n, 16); len(list) != want {
							t.Errorf("group %d lists %d blocks, want %d", grp, len(list), want)
						}
						sent += len(list)
					}
					before := value(t, d.m.KVTransferBytes)
					got := decode(t, d, prompt, greedy(12), kv)
					if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
						t.Errorf("decode tokens differ from the colocated engine's (-colocated +disaggregated):\n%s", diff)
					}
					// The decode pulls the blocks of all but the last prompt
					// token: the last block is skipped when that token
					// starts it.
					pulled := value(t, d.m.KVTransferBytes) - before
					if maxBytes := float64(sent * bb); pulled <= 0 || pulled > maxBytes {
						t.Errorf("decode pulled %v bytes, want at most the %d listed blocks' %v", pulled, sent, maxBytes)
					}
					// One block of every layer per 16 tokens without groups.
					if unclipped := float64(nb * bb * len(g.KVGroups(false)[0].Layers) / layers); n > 100 && pulled > unclipped/2 {
						t.Errorf("decode pulled %v bytes of a %d-token prompt, want well under half the unclipped %v", pulled, n, unclipped)
					}
					p.waitIdle(t)
					d.waitIdle(t)
				})
			}
		}
	}
}

// TestHybridMultiTurnClipsTheHistory runs two turns between engines with
// hybrid KV-cache groups: the decode holds the conversation with its
// sliding-window groups clipped, turn 2's prefill pulls it and matches a
// colocated engine; a turn 2 that diverges before the held windows
// recomputes its history (history_outside_window) and still matches.
func TestHybridMultiTurnClipsTheHistory(t *testing.T) {
	g := gemmaShaped(t)
	ref := newPD(t, pdOpts{fwd: g})
	p1 := newPD(t, pdOpts{role: RolePrefill, bidirectional: true, fwd: g, numBlocks: 512})
	p2 := newPD(t, pdOpts{role: RolePrefill, bidirectional: true, fwd: g, numBlocks: 512, policy: sched.LoadFailureRecompute})
	d := newPD(t, pdOpts{role: RoleDecode, bidirectional: true, fwd: g, numBlocks: 512})
	t.Cleanup(func() { releaseConversations(t, d) })

	prompt1 := promptOf(7001, 150)
	out1, conv := turn1(t, p1, d, prompt1, 40)
	held := len(prompt1) + len(out1) - 1
	ids := typed(t, conv).RemoteBlockIDs
	if nb := (held + 15) / 16; len(ids) != 6 || len(ids[0]) != nb || len(ids[1]) != nb-clipStart(32, held, 16) {
		t.Fatalf("conversation params list %d groups (%d, %d blocks); want 6, %d in the full group and %d in a sliding one", len(ids), len(ids[0]), len(ids[1]), nb, nb-clipStart(32, held, 16))
	}

	prompt2 := concat(prompt1, out1, promptOf(7002, 30))
	want := run(t, ref.e, &engine.Request{Prompt: prompt2, Params: greedy(10)})
	pulled := value(t, p2.m.HistoryTokensPulled)
	kv2 := prefillWith(t, p2, prompt2, greedy(10), conv)
	if got := value(t, p2.m.HistoryTokensPulled) - pulled; got != float64(held) {
		t.Errorf("the prefill pulled %v history tokens, want %d", got, held)
	}
	got := decode(t, d, prompt2, greedy(10), kv2)
	if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
		t.Errorf("turn 2 differs from the colocated engine (-colocated +disaggregated):\n%s", diff)
	}
	conv2 := wire(t, got.final.KVTransfer)

	// A turn 2 that keeps only the first 100 tokens: the held windows
	// start far later, so nothing can be pulled.
	prompt3 := concat(prompt2[:100], promptOf(7003, 40))
	want3 := run(t, ref.e, &engine.Request{Prompt: prompt3, Params: greedy(10)})
	outside := value(t, p2.m.HistoryRecomputed.WithLabelValues(reasonOutsideWindow))
	kv3 := prefillWith(t, p2, prompt3, greedy(10), conv2)
	if got := value(t, p2.m.HistoryRecomputed.WithLabelValues(reasonOutsideWindow)) - outside; got != 1 {
		t.Errorf("history_outside_window recomputes grew by %v, want 1", got)
	}
	got3 := decode(t, d, prompt3, greedy(10), kv3)
	if diff := gocmp.Diff(want3.tokens, got3.tokens); diff != "" {
		t.Errorf("the diverging turn differs from the colocated engine (-colocated +disaggregated):\n%s", diff)
	}
	p2.waitIdle(t)
}
