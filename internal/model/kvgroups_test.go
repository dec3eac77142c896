package model

import (
	"math/rand/v2"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/modelinit"
)

// TestGroupedKVIsBitIdentical checks that a model run over hybrid KV-cache
// groups (a block holds one group's layers, one block table per group)
// gives the bits of the one-group layout, with a sliding-window group's
// blocks dropped from its table (kvlayout.NullBlock) and their bytes
// scribbled over as soon as its window has passed them, chunked at random.
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
			const n = 128 // past a window and a 64-key chunk (the models' limit)
			tokens := randomTokens(r, n, sp.spec.Vocab)
			want := runAlone(t, m, single, tokens)

			nb := (n + layout.BlockSize - 1) / layout.BlockSize
			total := nb*len(groups) + 2
			perm := r.Perm(total)
			tables := make([][]int32, len(groups))
			for g := range tables {
				for i := range nb {
					tables[g] = append(tables[g], int32(perm[g*nb+i]))
				}
			}
			kv, _ := contiguous(layout, total*layout.BlockSize)
			for i := range kv {
				kv[i] = byte(r.Uint32())
			}
			dropped := 0
			V := m.VocabSize()
			for done := 0; done < n; {
				c := min(1+r.IntN(24), n-done)
				out, err := m.Forward([]Seq{{Tokens: tokens[done : done+c], Pos: done, Tables: tables, Logits: allIndexes(c)}}, kv, layout)
				if err != nil {
					t.Fatal(err)
				}
				for j := range c {
					if !sameBits(out[0][j*V:(j+1)*V], want[done+j]) {
						t.Fatalf("position %d: logits over grouped KV differ from the one-group layout", done+j)
					}
				}
				done += c
				for g, gr := range groups {
					first := kvlayout.FirstNeeded(gr.Window, done) / layout.BlockSize
					for i := range first {
						if id := tables[g][i]; id != kvlayout.NullBlock {
							bb := layout.BlockBytes()
							for k := range kv[int(id)*bb : (int(id)+1)*bb] {
								kv[int(id)*bb+k] = 0xff // NaN in either dtype
							}
							tables[g][i] = kvlayout.NullBlock
							dropped++
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
