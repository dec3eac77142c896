package model

import (
	"math/rand/v2"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/modelinit"
)

// TestGroupedKVIsBitIdentical checks that sequences run over hybrid
// KV-cache groups (a block holds one group's layers, one block table per
// group) give the bits of the one-group layout alone, batched together in
// random chunks, with a sliding-window group's blocks dropped from its
// table (kvlayout.NullBlock) and their bytes scribbled over as soon as its
// window has passed them.
func TestGroupedKVIsBitIdentical(t *testing.T) {
	for _, sp := range []struct {
		name string
		spec modelinit.Spec
		kv   kvlayout.ElemType
	}{
		{"gemma3 f32 window 19", testGemmaSpec("f32"), kvlayout.F32},
		{"gemma3 bf16 window 19 bf16 KV", testGemmaSpec("bf16"), kvlayout.BF16},
		{"mistral f32 window 37", testSpec(func(s *modelinit.Spec) { s.ModelType, s.SlidingWindow = "mistral", 37 }), kvlayout.F32},
	} {
		t.Run(sp.name, func(t *testing.T) {
			m := loadTestModel(t, writeTestModel(t, sp.spec), 2)
			single := m.KVLayoutOf(4, sp.kv)
			layout := m.GroupedKVLayout(4, sp.kv)
			groups := m.KVGroups(true)
			r := rand.New(rand.NewPCG(5, 6))
			// Past a window and a 64-key chunk (the models' limit is 128).
			lengths := []int{128, 97, 30}
			type run struct {
				tokens []int32
				want   [][]float32
				tables [][]int32
				done   int
			}
			bs := layout.BlockSize
			total := 2
			for _, n := range lengths {
				total += (n + bs - 1) / bs * len(groups)
			}
			perm := r.Perm(total)
			runs := make([]*run, len(lengths))
			next := 0
			for i, n := range lengths {
				rn := &run{tokens: randomTokens(r, n, sp.spec.Vocab), tables: make([][]int32, len(groups))}
				rn.want = runAlone(t, m, single, rn.tokens)
				for g := range groups {
					for range (n + bs - 1) / bs {
						rn.tables[g] = append(rn.tables[g], int32(perm[next]))
						next++
					}
				}
				runs[i] = rn
			}
			kv, _ := contiguous(layout, total*bs)
			for i := range kv {
				kv[i] = byte(r.Uint32())
			}
			dropped := 0
			V := m.VocabSize()
			for {
				var active []*run
				var seqs []Seq
				for _, rn := range runs {
					if rn.done < len(rn.tokens) && (r.IntN(3) > 0 || len(active) == 0) {
						c := min(1+r.IntN(24), len(rn.tokens)-rn.done)
						active = append(active, rn)
						seqs = append(seqs, Seq{Tokens: rn.tokens[rn.done : rn.done+c], Pos: rn.done, Tables: rn.tables, Logits: allIndexes(c)})
					}
				}
				if len(active) == 0 {
					break
				}
				out, err := m.Forward(seqs, kv, layout)
				if err != nil {
					t.Fatal(err)
				}
				for i, rn := range active {
					for j := range seqs[i].Tokens {
						if !sameBits(out[i][j*V:(j+1)*V], rn.want[rn.done+j]) {
							t.Fatalf("length %d position %d: logits over grouped KV differ from the one-group layout alone", len(rn.tokens), rn.done+j)
						}
					}
					rn.done += len(seqs[i].Tokens)
					for g, gr := range groups {
						first := kvlayout.FirstNeeded(gr.Window, rn.done) / bs
						for b := range first {
							if id := rn.tables[g][b]; id != kvlayout.NullBlock {
								bb := layout.BlockBytes()
								for k := int(id) * bb; k < (int(id)+1)*bb; k++ {
									kv[k] = 0xff // NaN in either dtype
								}
								rn.tables[g][b] = kvlayout.NullBlock
								dropped++
							}
						}
					}
				}
			}
			if dropped == 0 {
				t.Fatal("no block left a window: the test checks nothing")
			}
		})
	}
}

// TestGroupedKVRejectsMissingBlocks checks that Forward refuses a null
// entry that a sliding window still sees, and a full-attention group's.
func TestGroupedKVRejectsMissingBlocks(t *testing.T) {
	m := loadTestModel(t, writeTestModel(t, testGemmaSpec("f32")), 1)
	layout := m.GroupedKVLayout(4, kvlayout.F32)
	groups := m.KVGroups(true)
	kv, _ := contiguous(layout, 4*len(groups)*4)
	tables := make([][]int32, len(groups))
	for g := range tables {
		tables[g] = []int32{int32(4 * g), int32(4*g + 1), int32(4*g + 2), int32(4*g + 3)}
	}
	tables[0][0] = kvlayout.NullBlock // group 0 is the full-attention one
	if _, err := m.Forward([]Seq{{Tokens: []int32{1}, Pos: 10, Tables: tables}}, kv, layout); err == nil {
		t.Error("Forward accepted a null block of a full-attention group")
	}
	tables[0][0] = 0
	if _, err := m.Forward([]Seq{{Tokens: []int32{1}, Pos: 10, Blocks: tables[0]}}, kv, layout); err == nil {
		t.Error("Forward accepted one block table for several groups")
	}
}
