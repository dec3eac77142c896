package model

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/gguf"
	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/model/safetensors"
	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/testmodels"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// convertGGUF converts the checkpoint in dir to a GGUF file of encoding enc
// in a temporary directory and returns its path.
func convertGGUF(t testing.TB, dir, enc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "model-"+enc+".gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ConvertToGGUF(dir, f, GGUFOptions{Encoding: enc}); err != nil {
		f.Close()
		t.Fatalf("ConvertToGGUF(%s): %v", enc, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// logitsOf runs tokens alone through m with an f32 KV pool.
func logitsOf(t *testing.T, m *Model, tokens []int32) [][]float32 {
	t.Helper()
	return runAlone(t, m, m.KVLayoutOf(16, kvlayout.F32), tokens)
}

// relDiff returns max |a−b| over max |b|.
func relDiff(a, b [][]float32) float64 {
	var maxAbs, maxDiff float64
	for p := range b {
		for j := range b[p] {
			maxAbs = max(maxAbs, math.Abs(float64(b[p][j])))
			maxDiff = max(maxDiff, math.Abs(float64(a[p][j]-b[p][j])))
		}
	}
	return maxDiff / maxAbs
}

func greedy(t *testing.T, m *Model, prompt []int32, n int) []int32 {
	t.Helper()
	layout := m.KVLayoutOf(16, kvlayout.F32)
	kv, blocks := contiguous(layout, len(prompt)+n)
	ids := slices.Clone(prompt)
	next, pos := prompt, 0
	for range n {
		out, err := m.Forward([]Seq{{Tokens: next, Pos: pos, Blocks: blocks, Logits: []int{len(next) - 1}}}, kv, layout)
		if err != nil {
			t.Fatal(err)
		}
		pos += len(next)
		tok := argmax(out[0])
		ids = append(ids, tok)
		next = []int32{tok}
	}
	return ids
}

// TestGGUFMatchesCheckpoint converts every reference model to GGUF in its
// own dtype and checks that the GGUF model computes the checkpoint's
// logits bit for bit: names, metadata, layout and the q/k permutation of
// llama and mistral round-trip exactly. Llama 3 rope scaling goes through a
// rope_freqs tensor of f32 factors, which moves the frequencies by a few
// ulps.
func TestGGUFMatchesCheckpoint(t *testing.T) {
	for _, tc := range referenceCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeTestModel(t, tc.spec)
			want := loadTestModel(t, dir, 2)
			path := convertGGUF(t, dir, tc.spec.DType)
			got := loadTestModel(t, path, 2)
			if got.cfg.ModelType == "mistral" || want.cfg.ModelType == "mistral" {
				if got.cfg.ModelType != "llama" || got.MaxModelLen() != ggufContextLength(&want.cfg) {
					t.Errorf("mistral came back as %s with %d positions, want llama with %d", got.cfg.ModelType, got.MaxModelLen(), ggufContextLength(&want.cfg))
				}
			}
			if got.NumParams() != want.NumParams() || got.DType() != want.DType() {
				t.Errorf("params %d dtype %s, want %d %s", got.NumParams(), got.DType(), want.NumParams(), want.DType())
			}
			if got.Fingerprint() == want.Fingerprint() {
				t.Error("the GGUF model has the checkpoint's fingerprint")
			}
			r := rand.New(rand.NewPCG(5, 6))
			// A windowed model's file holds the positions inside its
			// window, where it computes what the checkpoint computes.
			tokens := randomTokens(r, min(40, got.MaxModelLen()), tc.spec.Vocab)
			a, b := logitsOf(t, got, tokens), logitsOf(t, want, tokens)
			if tc.spec.RopeScaling.Type == "llama3" {
				if got.cfg.RopeScaling.Type != "freqs" {
					t.Errorf("rope scaling %q, want freqs", got.cfg.RopeScaling.Type)
				}
				if d := relDiff(a, b); d > 1e-5 {
					t.Errorf("llama3 via rope_freqs: max |Δlogit| / max |logit| = %g > 1e-5", d)
				}
				return
			}
			for p := range b {
				if !sameBits(a[p], b[p]) {
					t.Fatalf("position %d: GGUF logits differ from the checkpoint's (max rel diff %g)", p, relDiff(a, b))
				}
			}
		})
	}
}

// TestGGUFStoriesF32MatchesGolden converts the shared stories260K model
// (f32) to an f32 GGUF with our converter and checks the golden greedy ids
// and first logits, as TestStories260KGreedyMatchesGolden does for the
// checkpoint.
func TestGGUFStoriesF32MatchesGolden(t *testing.T) {
	dir := testmodels.Stories260K(t)
	path := convertGGUF(t, dir, "f32")
	g := testutil.StoriesGolden(t)
	for _, threads := range []int{1, 2} {
		m := loadTestModel(t, path, threads)
		if !m.cfg.TieWordEmbeddings || m.DType() != tensor.F32 {
			t.Fatalf("tied %t dtype %s", m.cfg.TieWordEmbeddings, m.DType())
		}
		ids := greedy(t, m, g.PromptIDs, len(g.GreedyIDs)-len(g.PromptIDs))
		if diff := cmp.Diff(g.GreedyIDs, ids); diff != "" {
			t.Errorf("threads=%d: greedy ids differ from golden (-want +got):\n%s", threads, diff)
		}
		out := logitsOf(t, m, g.PromptIDs)
		for i, want := range g.Logits0 {
			if got := float64(out[0][i]); math.Abs(got-want) > 1e-4 {
				t.Errorf("threads=%d: logit %d at position 0 = %.7f, want %.7f", threads, i, got, want)
			}
		}
	}
}

// storiesPrompts are token sequences for comparing the stories260K model
// in two encodings: its golden greedy text in four windows.
func storiesPrompts(t *testing.T) [][]int32 {
	t.Helper()
	ids := testutil.StoriesGolden(t).GreedyIDs
	return [][]int32{ids[:8], ids[:60], append([]int32{1}, ids[40:100]...), append([]int32{1}, ids[150:200]...)}
}

// TestGGUFStoriesQ8_0NearF32 converts stories260K to Q8_0 (ffn_down, 172
// wide, falls back to F16) and compares it with the f32 model: logits
// within 3% of the largest logit at every position of four prompts, the
// f32 model's greedy token ranked first by the Q8_0 model at ≥ 95% of the
// positions, and the same first 12 greedy tokens from each prompt.
func TestGGUFStoriesQ8_0NearF32(t *testing.T) {
	dir := testmodels.Stories260K(t)
	ref := loadTestModel(t, dir, 2)
	path := convertGGUF(t, dir, "q8_0")
	q := loadTestModel(t, path, 2)
	if q.DType() != tensor.Q8_0 || q.KVDType() != kvlayout.BF16 {
		t.Errorf("dtype %s, KV %s; want q8_0 and bf16", q.DType(), q.KVDType())
	}
	if q.layers[0].down.DType != tensor.F16 || q.layers[0].o.DType != tensor.Q8_0 {
		t.Errorf("ffn_down %s, attn_output %s; want f16 (fallback) and q8_0", q.layers[0].down.DType, q.layers[0].o.DType)
	}
	if w, b := q.WeightBytes(), ref.WeightBytes(); w*3 > b {
		t.Errorf("Q8_0 weights take %d bytes, f32 %d", w, b)
	}
	agree, total := 0, 0
	var worst float64
	for i, prompt := range storiesPrompts(t) {
		a, b := logitsOf(t, q, prompt), logitsOf(t, ref, prompt)
		worst = max(worst, relDiff(a, b))
		for p := range b {
			total++
			if argmax(a[p]) == argmax(b[p]) {
				agree++
			}
		}
		if g, w := greedy(t, q, prompt, 12), greedy(t, ref, prompt, 12); !slices.Equal(g, w) {
			t.Errorf("prompt %d: Q8_0 greedy %v, f32 %v", i, g[len(prompt):], w[len(prompt):])
		}
	}
	t.Logf("Q8_0 vs f32: max |Δlogit| / max |logit| = %.4f, top-1 agreement %d/%d", worst, agree, total)
	if worst > 0.03 {
		t.Errorf("max |Δlogit| / max |logit| = %.4f > 0.03", worst)
	}
	if float64(agree) < 0.95*float64(total) {
		t.Errorf("top-1 agreement %d/%d < 95%%", agree, total)
	}
}

// kquantSpec is a small model wide enough for the K-quants (256-weight
// blocks).
func kquantSpec() modelinit.Spec {
	return testSpec(func(s *modelinit.Spec) {
		s.Hidden, s.Heads, s.KVHeads, s.HeadDim, s.Intermediate, s.Layers, s.Tied, s.Std = 256, 4, 2, 64, 256, 2, true, 0.02
	})
}

// TestGGUFQ4KMMix checks the types of llama.cpp's Q4_K_M mix (see
// GGUFEncodings) on 8 layers, and the types a q4_k_m file of kquantSpec
// gets.
func TestGGUFQ4KMMix(t *testing.T) {
	for i := range 8 {
		more := i == 0 || i == 3 || i == 6 || i == 7 // use_more_bits(i, 8)
		for _, part := range []string{"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"} {
			want := gguf.Q4_K
			if more && (part == "attn_v.weight" || part == "ffn_down.weight") {
				want = gguf.Q6_K
			}
			if got := ggufWeightType("q4_k_m", part, i, 8, false); got != want {
				t.Errorf("layer %d %s: %s, want %s", i, part, got, want)
			}
		}
	}
	if got := ggufWeightType("q4_k_m", "", 0, 8, true); got != gguf.Q6_K {
		t.Errorf("output: %s, want Q6_K", got)
	}
	if got := ggufWeightType("q8_0", "", 0, 8, true); got != gguf.Q8_0 {
		t.Errorf("q8_0 output: %s, want Q8_0", got)
	}

	path := convertGGUF(t, writeTestModel(t, kquantSpec()), "q4_k_m")
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, ti := range f.Tensors {
		want := gguf.Q4_K
		switch {
		case len(ti.Dims) == 1:
			want = gguf.F32
		case ti.Name == "token_embd.weight", // tied: the output matrix
			ti.Name == "blk.1.attn_v.weight", ti.Name == "blk.1.ffn_down.weight": // use_more_bits(1, 2)
			want = gguf.Q6_K
		}
		if ti.Type != want {
			t.Errorf("%s: %s, want %s", ti.Name, ti.Type, want)
		}
	}
	if v, _, _ := f.Uint("general.file_type"); v != 15 {
		t.Errorf("general.file_type %d, want 15 (MOSTLY_Q4_K_M)", v)
	}
	if v, _, _ := f.Uint("general.quantization_version"); v != 2 {
		t.Errorf("general.quantization_version %d, want 2", v)
	}
}

// dequantizedTwin writes a Hugging Face checkpoint holding m's weights as
// the f32 values its blocks stand for, with the config of dir.
func dequantizedTwin(t *testing.T, m *Model, dir string) string {
	t.Helper()
	out := t.TempDir()
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	var infos []safetensors.Info
	var data [][]byte
	mat := func(name string, rows, cols int, row func(r int, dst []float32)) {
		vals := make([]float32, rows*cols)
		for r := range rows {
			row(r, vals[r*cols:(r+1)*cols])
		}
		infos = append(infos, safetensors.Info{Name: name, DType: safetensors.F32, Shape: []int{rows, cols}})
		data = append(data, slices.Clone(f32Bytes(vals)))
	}
	vec := func(name string, v []float32) {
		infos = append(infos, safetensors.Info{Name: name, DType: safetensors.F32, Shape: []int{len(v)}})
		data = append(data, slices.Clone(f32Bytes(v)))
	}
	whole := func(w tensor.Mat) func(int, []float32) { return func(r int, dst []float32) { w.Row(r, dst) } }
	part := func(g linearGroup, k int) func(int, []float32) {
		return func(r int, dst []float32) {
			if g.fused {
				g.mats[0].Row(g.off[k]+r, dst)
			} else {
				g.mats[k].Row(r, dst)
			}
		}
	}
	c := m.cfg
	mat("model.embed_tokens.weight", c.Vocab, c.Hidden, whole(m.embed))
	if !c.TieWordEmbeddings {
		mat("lm_head.weight", c.Vocab, c.Hidden, whole(m.lmHead))
	}
	vec("model.norm.weight", m.finalNorm)
	for i, l := range m.layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		vec(p+"input_layernorm.weight", l.attnNorm)
		vec(p+"post_attention_layernorm.weight", l.ffnNorm)
		mat(p+"self_attn.q_proj.weight", c.QDim(), c.Hidden, part(l.qkv, 0))
		mat(p+"self_attn.k_proj.weight", c.KVDim(), c.Hidden, part(l.qkv, 1))
		mat(p+"self_attn.v_proj.weight", c.KVDim(), c.Hidden, part(l.qkv, 2))
		mat(p+"self_attn.o_proj.weight", c.Hidden, c.QDim(), whole(l.o))
		mat(p+"mlp.gate_proj.weight", c.Intermediate, c.Hidden, part(l.gateUp, 0))
		mat(p+"mlp.up_proj.weight", c.Intermediate, c.Hidden, part(l.gateUp, 1))
		mat(p+"mlp.down_proj.weight", c.Hidden, c.Intermediate, whole(l.down))
	}
	f, err := os.Create(filepath.Join(out, safetensors.SingleFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := safetensors.NewWriter(f, infos, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range data {
		if _, err := w.Write(d); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestGGUFQuantizedNearTwins checks each quantized encoding of a random
// model wide enough for K-quants against two f32 models: the checkpoint it
// was converted from (the quantization error of weights and activations:
// bounds per encoding, from 2% of the largest logit for q8_0 to 15% for
// q4_0) and its dequantized twin, which has exactly the weights the blocks
// stand for (only the activations' quantization to 8 bits is left: within
// 2%). Random models are more sensitive than trained ones, and top-1
// agreement is not asserted for them (see TestGGUFStoriesQ8_0NearF32).
func TestGGUFQuantizedNearTwins(t *testing.T) {
	spec := kquantSpec()
	dir := writeTestModel(t, spec)
	ref := loadTestModel(t, dir, 2)
	tokens := randomTokens(rand.New(rand.NewPCG(7, 8)), 24, spec.Vocab)
	want := logitsOf(t, ref, tokens)
	for _, c := range []struct {
		enc   string
		bound float64
	}{{"q8_0", 0.02}, {"q6_k", 0.05}, {"q5_k_m", 0.08}, {"q4_k_m", 0.1}, {"q4_0", 0.15}} {
		m := loadTestModel(t, convertGGUF(t, dir, c.enc), 2)
		got := logitsOf(t, m, tokens)
		twin := logitsOf(t, loadTestModel(t, dequantizedTwin(t, m, dir), 2), tokens)
		d, dt := relDiff(got, want), relDiff(got, twin)
		t.Logf("%s: max |Δlogit| / max |logit|: %.4f against f32, %.4f against the dequantized twin", c.enc, d, dt)
		if d > c.bound {
			t.Errorf("%s: %.4f against f32 > %g", c.enc, d, c.bound)
		}
		if dt > 0.02 {
			t.Errorf("%s: %.4f against the dequantized twin > 0.02", c.enc, dt)
		}
	}
}

// TestGGUFQuantizedIsBatchInvariant checks quantized models as the batch
// invariance test checks the others: alone, chunked and batched give the
// same bits.
func TestGGUFQuantizedIsBatchInvariant(t *testing.T) {
	paths := map[string]string{
		"stories q8_0":     convertGGUF(t, testmodels.Stories260K(t), "q8_0"),
		"k-quant q4_k_m":   convertGGUF(t, writeTestModel(t, kquantSpec()), "q4_k_m"),
		"qwen3_moe q4_k_m": convertGGUF(t, writeTestModel(t, kquantMoESpec()), "q4_k_m"),
	}
	for name, path := range paths {
		alone := loadTestModel(t, path, 1)
		layout := alone.KVLayout(4)
		r := rand.New(rand.NewPCG(9, 10))
		lengths := []int{1, 7, 33}
		prompts := make([][]int32, len(lengths))
		want := make([][][]float32, len(lengths))
		for i, n := range lengths {
			prompts[i] = randomTokens(r, n, alone.VocabSize())
			want[i] = runAlone(t, alone, layout, prompts[i])
		}
		for _, threads := range []int{1, 2} {
			m := loadTestModel(t, path, threads)
			for _, chunk := range []int{1, 5, 0} {
				runs, kv := planBatch(r, layout, prompts, chunk)
				driveBatch(t, m, r, layout, kv, runs)
				for i, run := range runs {
					for p := range run.tokens {
						if !sameBits(run.logits[p], want[i][p]) {
							t.Fatalf("%s threads=%d chunk=%d: sequence %d position %d differs from running alone", name, threads, chunk, i, p)
						}
					}
				}
			}
		}
	}
}

// TestPermuteRowsIsLlamaCppsPermutation checks permuteRows against the
// numpy expression of llama.cpp's converter, evaluated by index:
// w.reshape(heads, 2, d/2, cols).swapaxes(1, 2).reshape(w.shape) moves
// element [h][j][i] to [h][i][j].
func TestPermuteRowsIsLlamaCppsPermutation(t *testing.T) {
	heads, hd, cols := 3, 8, 2
	rows := heads * hd
	w := make([]byte, rows*cols)
	for i := range w {
		w[i] = byte(i)
	}
	want := make([]byte, len(w))
	for h := range heads {
		for j := range 2 {
			for i := range hd / 2 {
				src := h*hd + j*(hd/2) + i // [h][j][i] of the (heads, 2, d/2) view
				dst := h*hd + i*2 + j      // [h][i][j] of the swapped view
				copy(want[dst*cols:(dst+1)*cols], w[src*cols:(src+1)*cols])
			}
		}
	}
	got := slices.Clone(w)
	if err := permuteRows(got, heads, hd, cols, false); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("permuteRows = %v, want %v", got, want)
	}
	if err := permuteRows(got, heads, hd, cols, true); err != nil || !bytes.Equal(got, w) {
		t.Fatalf("inverse did not restore the rows: %v %v", got, err)
	}
	if err := permuteRows(got, heads, hd+1, cols, true); err == nil {
		t.Error("odd head size accepted")
	}
}

func TestGGUFTypeFallback(t *testing.T) {
	for _, c := range []struct {
		in   gguf.Type
		cols int
		want gguf.Type
	}{
		{gguf.Q4_K, 512, gguf.Q4_K}, {gguf.Q4_K, 64, gguf.Q5_0}, {gguf.Q5_K, 64, gguf.Q8_0}, {gguf.Q6_K, 64, gguf.Q8_0},
		{gguf.Q4_K, 172, gguf.F16}, {gguf.Q6_K, 172, gguf.F16}, {gguf.Q5_0, 96, gguf.Q5_0},
		{gguf.Q8_0, 172, gguf.F16}, {gguf.Q4_0, 96, gguf.Q4_0}, {gguf.F32, 3, gguf.F32},
	} {
		if got := ggufFallback(c.in, c.cols); got != c.want {
			t.Errorf("ggufFallback(%s, %d) = %s, want %s", c.in, c.cols, got, c.want)
		}
	}
	var layers []int
	for i := range 16 {
		if useMoreBits(i, 16) {
			layers = append(layers, i)
		}
	}
	if !slices.Equal(layers, []int{0, 1, 4, 7, 10, 13, 14, 15}) {
		t.Errorf("use_more_bits layers of 16: %v", layers)
	}
}

// rewriteGGUF copies the GGUF file at src to a new file with edited
// metadata and tensor infos (tensors keep their data, matched by name;
// a tensor added by editTensors gets zeros).
func rewriteGGUF(t *testing.T, src string, editKV func([]gguf.KV) []gguf.KV, editTensors func([]gguf.TensorInfo) []gguf.TensorInfo) string {
	t.Helper()
	f, err := gguf.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kv := slices.Clone(f.KV)
	if editKV != nil {
		kv = editKV(kv)
	}
	infos := slices.Clone(f.Tensors)
	if editTensors != nil {
		infos = editTensors(infos)
	}
	var buf bytes.Buffer
	w, err := gguf.NewWriter(&buf, kv, infos)
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range w.Tensors() {
		data := make([]byte, ti.Size)
		if old, ok := f.Tensor(ti.Name); ok && old.Size == ti.Size {
			if err := f.ReadTensor(old, data); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := w.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "edited.gguf")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func setKV(key string, v gguf.Value) func([]gguf.KV) []gguf.KV {
	return func(kv []gguf.KV) []gguf.KV {
		for i := range kv {
			if kv[i].Key == key {
				kv[i].Value = v
				return kv
			}
		}
		return append(kv, gguf.KV{Key: key, Value: v})
	}
}

func dropKV(key string) func([]gguf.KV) []gguf.KV {
	return func(kv []gguf.KV) []gguf.KV {
		return slices.DeleteFunc(kv, func(p gguf.KV) bool { return p.Key == key })
	}
}

func TestLoadGGUFReportsWhatIsWrong(t *testing.T) {
	dir := writeTestModel(t, testSpec(func(s *modelinit.Spec) {}))
	good := convertGGUF(t, dir, "q8_0")
	cases := []struct {
		name    string
		kv      func([]gguf.KV) []gguf.KV
		tensors func([]gguf.TensorInfo) []gguf.TensorInfo
		want    string
	}{
		{"unknown architecture", setKV("general.architecture", gguf.StringValue("phi2")), nil, `architecture "phi2" is not supported`},
		{"gpt-oss", setKV("general.architecture", gguf.StringValue("gpt-oss")), nil, `architecture "gpt-oss" is not supported: gpt-oss needs attention sinks, alternating sliding-window layers with YaRN RoPE and MXFP4-quantized experts`},
		{"no architecture", dropKV("general.architecture"), nil, "general.architecture is missing"},
		{"missing key", dropKV("llama.embedding_length"), nil, "required key llama.embedding_length is missing"},
		{"key of the wrong type", setKV("llama.block_count", gguf.StringValue("2")), nil, `key "llama.block_count": expected a non-negative integer`},
		{"huge block count", setKV("llama.block_count", gguf.Uint32Value(1<<30)), nil, "expected 1 to"},
		{"block count beyond the tensors", setKV("llama.block_count", gguf.Uint32Value(3)), nil, `tensor "blk.2.attn_norm.weight" (Hugging Face model.layers.2.input_layernorm.weight) is missing`},
		{"fewer layers than tensors", setKV("llama.block_count", gguf.Uint32Value(1)), nil, `"blk.1.attn_norm.weight" is beyond the 1 layers`},
		{"no eps", dropKV("llama.attention.layer_norm_rms_epsilon"), nil, "layer_norm_rms_epsilon"},
		{"partial rotary", setKV("llama.rope.dimension_count", gguf.Uint32Value(8)), nil, "partial rotary"},
		{"yarn", setKV("llama.rope.scaling.type", gguf.StringValue("yarn")), nil, `rope.scaling.type "yarn" is not supported`},
		{"kv heads not dividing", setKV("llama.attention.head_count_kv", gguf.Uint32Value(3)), nil, "does not divide"},
		{"token list of the wrong size", setKV("tokenizer.ggml.tokens", gguf.ArrayValue([]string{"a", "b"})), nil, "has 2 tokens but token_embd.weight has 96 rows"},
		{"eos outside the vocabulary", setKV("tokenizer.ggml.eos_token_id", gguf.Uint32Value(500)), nil, "outside the vocabulary"},
		{"unknown tensor", nil, func(ts []gguf.TensorInfo) []gguf.TensorInfo {
			return append(ts, gguf.TensorInfo{Name: "blk.0.attn_q_norm.weight", Type: gguf.F32, Dims: []int64{16}})
		}, `"blk.0.attn_q_norm.weight" is a per-layer tensor the llama architecture does not have`},
		{"stray tensor", nil, func(ts []gguf.TensorInfo) []gguf.TensorInfo {
			return append(ts, gguf.TensorInfo{Name: "mm.proj", Type: gguf.F32, Dims: []int64{16}})
		}, `"mm.proj" is not part of the llama architecture`},
		{"missing tensor", nil, func(ts []gguf.TensorInfo) []gguf.TensorInfo {
			return slices.DeleteFunc(ts, func(ti gguf.TensorInfo) bool { return ti.Name == "blk.1.ffn_up.weight" })
		}, `tensor "blk.1.ffn_up.weight" (Hugging Face model.layers.1.mlp.up_proj.weight) is missing`},
		{"wrong shape", nil, func(ts []gguf.TensorInfo) []gguf.TensorInfo {
			for i := range ts {
				if ts[i].Name == "blk.0.ffn_gate.weight" {
					ts[i].Dims = []int64{32, 80}
				}
			}
			return ts
		}, `"blk.0.ffn_gate.weight" (Hugging Face model.layers.0.mlp.gate_proj.weight): expected shape [80 48], found [80 32]`},
	}
	pool := tensor.NewPool(1)
	defer pool.Close()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			kv := c.kv
			if c.name == "token list of the wrong size" || c.name == "eos outside the vocabulary" {
				base := kv
				kv = func(p []gguf.KV) []gguf.KV { return base(p) }
			}
			path := rewriteGGUF(t, good, kv, c.tensors)
			m, err := Load(path, pool)
			if err == nil {
				m.Close()
				t.Fatal("Load succeeded")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not contain %q", err, c.want)
			}
		})
	}
	// The untouched file loads, and so does its config alone.
	m, err := Load(good, pool)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if c, err := LoadConfig(good); err != nil || c.Layers != 2 || c.Hidden != 48 {
		t.Errorf("LoadConfig: %+v, %v", c, err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "none.gguf"), pool); err == nil {
		t.Error("a missing file loaded")
	}
}

// TestGGUFLoadReadersAgree checks that the parallel load gives the same
// model whatever the number of reading threads.
func TestGGUFLoadReadersAgree(t *testing.T) {
	path := convertGGUF(t, testmodels.Stories260K(t), "q8_0")
	defer func(n int) { ggufLoadReaders = n }(ggufLoadReaders)
	var prints []string
	for _, n := range []int{1, 3} {
		ggufLoadReaders = n
		prints = append(prints, loadTestModel(t, path, 1).Fingerprint())
	}
	if prints[0] != prints[1] {
		t.Errorf("fingerprints differ: %v", prints)
	}
}
