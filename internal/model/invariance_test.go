package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/modelinit"
)

// seqRun is one sequence driven through Forward in chunks.
type seqRun struct {
	tokens []int32
	blocks []int32
	done   int
	chunk  int
	logits [][]float32 // per position, copied out
}

// runAlone runs tokens as the only sequence in one call with a contiguous
// block table and returns the logits of every position.
func runAlone(t *testing.T, m *Model, layout kvlayout.Layout, tokens []int32) [][]float32 {
	t.Helper()
	kv, blocks := contiguous(layout, len(tokens))
	out, err := m.Forward([]Seq{{Tokens: tokens, Blocks: blocks, Logits: allIndexes(len(tokens))}}, kv, layout)
	if err != nil {
		t.Fatal(err)
	}
	V := m.VocabSize()
	rows := make([][]float32, len(tokens))
	for p := range rows {
		rows[p] = append([]float32(nil), out[0][p*V:(p+1)*V]...)
	}
	return rows
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestForwardIsBatchInvariant checks that a sequence's logits are
// bit-identical whether it runs alone in one call or chunked (1, 3, 16 or a
// random size per call) and batched with other sequences of different
// lengths, over shuffled physical blocks, on one or two threads.
func TestForwardIsBatchInvariant(t *testing.T) {
	qwen := testSpec(func(s *modelinit.Spec) { s.ModelType = "qwen2"; s.DType = "bf16"; s.Tied = true })
	specs := []struct {
		name string
		spec modelinit.Spec
		kv   kvlayout.ElemType
	}{
		{"qwen2 bf16 GQA bf16 KV", qwen, kvlayout.BF16},
		{"qwen2 bf16 GQA f32 KV", qwen, kvlayout.F32},
		{"llama f32 llama3 rope", testSpec(func(s *modelinit.Spec) {
			s.RopeScaling = modelinit.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 64}
		}), kvlayout.F32},
		{"qwen3 bf16 head_dim 24 bf16 KV", testSpec(func(s *modelinit.Spec) { s.ModelType = "qwen3"; s.DType = "bf16"; s.HeadDim = 24 }), kvlayout.BF16},
		// Up to 127 tokens in a call share 8 experts, so an expert's
		// matmuls see its tokens in many different groupings.
		{"qwen3_moe bf16 top-2 of 8", testMoESpec("bf16"), kvlayout.BF16},
		{"qwen3_moe f32 top-2 of 8", testMoESpec("f32"), kvlayout.F32},
		{"mixtral bf16 top-2 of 4", testSpec(func(s *modelinit.Spec) {
			s.ModelType, s.DType = "mixtral", "bf16"
			s.MoE = modelinit.MoE{Experts: 4, TopK: 2}
		}), kvlayout.BF16},
		// Windows shorter than the longer prompts, neither a multiple of
		// the 64-key chunk nor of the block size: a window start inside
		// a chunk and inside a block.
		{"mistral f32 window 37", testSpec(func(s *modelinit.Spec) { s.ModelType, s.SlidingWindow = "mistral", 37 }), kvlayout.F32},
		{"mistral bf16 window 7 bf16 KV", testSpec(func(s *modelinit.Spec) { s.ModelType, s.DType, s.SlidingWindow = "mistral", "bf16", 7 }), kvlayout.BF16},
		{"gemma3 bf16 window 19 bf16 KV", testGemmaSpec("bf16"), kvlayout.BF16},
		{"gemma3 f32 window 19", testGemmaSpec("f32"), kvlayout.F32},
		{"qwen3 bf16 window 70 bf16 KV", testSpec(func(s *modelinit.Spec) { s.ModelType, s.DType, s.SlidingWindow = "qwen3", "bf16", 70 }), kvlayout.BF16},
	}
	chunkings := []struct {
		name  string
		chunk int // 0 = random per call
	}{{"chunks of 1", 1}, {"chunks of 3", 3}, {"chunks of 16", 16}, {"random chunks", 0}}
	for _, sp := range specs {
		dir := writeTestModel(t, sp.spec)
		alone := loadTestModel(t, dir, 1)
		layout := alone.KVLayoutOf(4, sp.kv)
		r := rand.New(rand.NewPCG(3, 4))
		lengths := []int{1, 5, 17, 40, 64}
		if sp.spec.SlidingWindow > 0 {
			// Past the window and across a chunk boundary.
			lengths = append(lengths, 100)
		}
		prompts := make([][]int32, len(lengths))
		want := make([][][]float32, len(lengths))
		for i, n := range lengths {
			prompts[i] = randomTokens(r, n, sp.spec.Vocab)
			want[i] = runAlone(t, alone, layout, prompts[i])
		}
		for _, threads := range []int{1, 2} {
			m := loadTestModel(t, dir, threads)
			for _, ch := range chunkings {
				t.Run(sp.name+"/"+ch.name+"/threads "+string(rune('0'+threads)), func(t *testing.T) {
					runs, kv := planBatch(r, layout, prompts, ch.chunk)
					driveBatch(t, m, r, layout, kv, runs)
					for i, run := range runs {
						for p := range run.tokens {
							if !sameBits(run.logits[p], want[i][p]) {
								t.Fatalf("sequence %d (length %d) position %d: batched logits differ from running alone", i, len(run.tokens), p)
							}
						}
					}
				})
			}
		}
	}
}

// testGemmaSpec is a small gemma3_text spec: layers 0, 1, 3 local with a
// window of 19, layer 2 global, linear RoPE scaling of the global layers.
func testGemmaSpec(dtype string) modelinit.Spec {
	return testSpec(func(s *modelinit.Spec) {
		s.ModelType, s.DType, s.Layers, s.Tied = "gemma3_text", dtype, 4, true
		s.SlidingWindow = 19
		s.RopeScaling = modelinit.RopeScaling{Type: "linear", Factor: 8}
		s.Gemma = modelinit.Gemma{Pattern: 3, LocalRopeTheta: 10000, QueryScalar: 20}
	})
}

// testMoESpec is a small qwen3_moe spec: 8 experts, top-2 normalised,
// layer 1 of 3 dense.
func testMoESpec(dtype string) modelinit.Spec {
	return testSpec(func(s *modelinit.Spec) {
		s.ModelType, s.DType, s.Layers = "qwen3_moe", dtype, 3
		s.MoE = modelinit.MoE{Experts: 8, TopK: 2, Intermediate: 24, NormTopK: true, DenseLayers: []int{1}}
	})
}

// planBatch gives every prompt a shuffled set of physical blocks in one
// shared pool.
func planBatch(r *rand.Rand, layout kvlayout.Layout, prompts [][]int32, chunk int) ([]*seqRun, []byte) {
	total := 0
	need := make([]int, len(prompts))
	for i, p := range prompts {
		need[i] = (len(p) + layout.BlockSize - 1) / layout.BlockSize
		total += need[i]
	}
	total += 3 // spare blocks nobody uses
	perm := r.Perm(total)
	runs := make([]*seqRun, len(prompts))
	next := 0
	for i, p := range prompts {
		run := &seqRun{tokens: p, chunk: chunk, logits: make([][]float32, len(p))}
		for range need[i] {
			run.blocks = append(run.blocks, int32(perm[next]))
			next++
		}
		runs[i] = run
	}
	// Garbage in the pool (random bytes: NaNs included) must not leak into
	// results.
	kv, _ := contiguous(layout, total*layout.BlockSize)
	for i := range kv {
		kv[i] = byte(r.Uint32())
	}
	return runs, kv
}

// driveBatch advances a random subset of unfinished sequences each call,
// in random order, until all are done, recording their logits.
func driveBatch(t *testing.T, m *Model, r *rand.Rand, layout kvlayout.Layout, kv []byte, runs []*seqRun) {
	t.Helper()
	V := m.VocabSize()
	for {
		var active []*seqRun
		for _, run := range runs {
			if run.done < len(run.tokens) && (r.IntN(3) > 0 || len(active) == 0) {
				active = append(active, run)
			}
		}
		if len(active) == 0 {
			return
		}
		r.Shuffle(len(active), func(i, j int) { active[i], active[j] = active[j], active[i] })
		seqs := make([]Seq, len(active))
		for i, run := range active {
			n := run.chunk
			if n == 0 {
				n = 1 + r.IntN(20)
			}
			n = min(n, len(run.tokens)-run.done)
			seqs[i] = Seq{Tokens: run.tokens[run.done : run.done+n], Pos: run.done, Blocks: run.blocks, Logits: allIndexes(n)}
		}
		out, err := m.Forward(seqs, kv, layout)
		if err != nil {
			t.Fatal(err)
		}
		for i, run := range active {
			for j := range seqs[i].Tokens {
				run.logits[run.done+j] = append([]float32(nil), out[i][j*V:(j+1)*V]...)
			}
			run.done += len(seqs[i].Tokens)
		}
	}
}
