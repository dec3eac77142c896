package model

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/model/safetensors"
	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// refModel is a straightforward float64 implementation of the Hugging Face
// Llama/Qwen2 forward pass with a contiguous KV cache, written
// independently of the fast path (it reads raw tensors and implements
// rope_scaling from the Hugging Face formulas) to check it.
type refModel struct {
	// roundKV stores K and V rounded to bf16, as a bf16 KV pool does.
	roundKV bool
	cfg     *Config
	set     *safetensors.Set
	invFreq []float64
}

func newRefModel(t *testing.T, dir string) *refModel {
	t.Helper()
	cfg, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	set, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	r := &refModel{cfg: cfg, set: set}
	r.invFreq = refInvFreq(cfg)
	return r
}

// refInvFreq follows transformers' _compute_default_rope_parameters,
// _compute_linear_scaling_rope_parameters and
// _compute_llama3_parameters literally (as array expressions).
func refInvFreq(c *Config) []float64 {
	d := c.HeadDim
	inv := make([]float64, d/2)
	for i := range inv {
		inv[i] = 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(d))
	}
	rs := c.RopeScaling
	switch rs.Type {
	case "linear":
		for i := range inv {
			inv[i] /= rs.Factor
		}
	case "llama3":
		old := float64(rs.OriginalMaxPositionEmbeddings)
		lowWl, highWl := old/rs.LowFreqFactor, old/rs.HighFreqFactor
		out := make([]float64, len(inv))
		for i, f := range inv {
			wl := 2 * math.Pi / f
			scaled := f
			if wl > lowWl {
				scaled = f / rs.Factor
			}
			smooth := (old/wl - rs.LowFreqFactor) / (rs.HighFreqFactor - rs.LowFreqFactor)
			smoothed := (1-smooth)*scaled/rs.Factor + smooth*scaled
			isMedium := !(wl < highWl) && !(wl > lowWl)
			if isMedium {
				scaled = smoothed
			}
			out[i] = scaled
		}
		inv = out
	}
	return inv
}

func (r *refModel) tensor(t *testing.T, name string) []float64 {
	t.Helper()
	ts, ok := r.set.Tensor(name)
	if !ok {
		t.Fatalf("reference: tensor %s missing", name)
	}
	n := int(ts.Elements())
	out := make([]float64, n)
	for i := range out {
		switch ts.DType {
		case safetensors.F32:
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(ts.Data[4*i:])))
		case safetensors.BF16:
			out[i] = float64(tensor.BF16ToF32(binary.LittleEndian.Uint16(ts.Data[2*i:])))
		case safetensors.F16:
			out[i] = float64(tensor.F16ToF32(binary.LittleEndian.Uint16(ts.Data[2*i:])))
		default:
			t.Fatalf("reference: %s has dtype %s", name, ts.DType)
		}
	}
	return out
}

// refLinear computes w·x + bias. With roundX the activations are first
// rounded to bf16, as MatMul does for bf16 weights when
// tensor.BF16Activations reports so.
func refLinear(w []float64, rows, cols int, x []float64, bias []float64, roundX bool) []float64 {
	if roundX {
		r := make([]float64, len(x))
		for i, v := range x {
			r[i] = float64(tensor.BF16ToF32(tensor.F32ToBF16(float32(v))))
		}
		x = r
	}
	out := make([]float64, rows)
	for j := range rows {
		var s float64
		for k := range cols {
			s += w[j*cols+k] * x[k]
		}
		if bias != nil {
			s += bias[j]
		}
		out[j] = s
	}
	return out
}

func refNorm(x, w []float64, eps float64) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+eps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = v * inv * w[i]
	}
	return out
}

func (r *refModel) rope(x []float64, pos int) {
	half := len(r.invFreq)
	for i, f := range r.invFreq {
		c, s := math.Cos(float64(pos)*f), math.Sin(float64(pos)*f)
		a, b := x[i], x[i+half]
		x[i] = a*c - b*s
		x[i+half] = b*c + a*s
	}
}

// logits returns the logits of every position of tokens, [len(tokens)][vocab].
func (r *refModel) logits(t *testing.T, tokens []int32) [][]float64 {
	t.Helper()
	c := r.cfg
	H, hd, qd, kvd, F := c.Hidden, c.HeadDim, c.QDim(), c.KVDim(), c.Intermediate
	get := func(name string) []float64 { return r.tensor(t, name) }
	opt := func(name string) []float64 {
		if _, ok := r.set.Tensor(name); !ok {
			return nil
		}
		return get(name)
	}
	// rx reports whether MatMul rounds the activations multiplied by the
	// named weights to bf16.
	rx := func(name string) bool {
		ts, ok := r.set.Tensor(name)
		return ok && ts.DType == safetensors.BF16 && tensor.BF16Activations()
	}
	emb := get("model.embed_tokens.weight")
	xs := make([][]float64, len(tokens))
	for i, id := range tokens {
		xs[i] = append([]float64(nil), emb[int(id)*H:(int(id)+1)*H]...)
	}
	for l := range c.Layers {
		p := "model.layers." + strconv.Itoa(l) + "."
		wq, wk, wv, wo := get(p+"self_attn.q_proj.weight"), get(p+"self_attn.k_proj.weight"), get(p+"self_attn.v_proj.weight"), get(p+"self_attn.o_proj.weight")
		bq, bk, bv, bo := opt(p+"self_attn.q_proj.bias"), opt(p+"self_attn.k_proj.bias"), opt(p+"self_attn.v_proj.bias"), opt(p+"self_attn.o_proj.bias")
		n1, n2 := get(p+"input_layernorm.weight"), get(p+"post_attention_layernorm.weight")
		wg, wu, wd := get(p+"mlp.gate_proj.weight"), get(p+"mlp.up_proj.weight"), get(p+"mlp.down_proj.weight")
		var ks, vs [][]float64
		for pos, x := range xs {
			xn := refNorm(x, n1, c.RMSNormEps)
			q := refLinear(wq, qd, H, xn, bq, rx(p+"self_attn.q_proj.weight"))
			k := refLinear(wk, kvd, H, xn, bk, rx(p+"self_attn.k_proj.weight"))
			v := refLinear(wv, kvd, H, xn, bv, rx(p+"self_attn.v_proj.weight"))
			for h := range c.Heads {
				r.rope(q[h*hd:(h+1)*hd], pos)
			}
			for h := range c.KVHeads {
				r.rope(k[h*hd:(h+1)*hd], pos)
			}
			if r.roundKV {
				for i := range k {
					k[i] = float64(tensor.BF16ToF32(tensor.F32ToBF16(float32(k[i]))))
					v[i] = float64(tensor.BF16ToF32(tensor.F32ToBF16(float32(v[i]))))
				}
			}
			ks, vs = append(ks, k), append(vs, v)
			// The model scales the queries by 1/√head_dim before scoring;
			// against bf16 keys it then rounds them too when MatMul rounds
			// activations (scores are a MatMul by the keys).
			qs := make([]float64, len(q))
			for i, v := range q {
				qs[i] = v / math.Sqrt(float64(hd))
				if r.roundKV && tensor.BF16Activations() {
					qs[i] = float64(tensor.BF16ToF32(tensor.F32ToBF16(float32(qs[i]))))
				}
			}
			att := make([]float64, qd)
			for h := range c.Heads {
				kvh := h / (c.Heads / c.KVHeads)
				// A sliding-window layer sees keys (pos−W, pos].
				lo := 0
				if w := c.LayerWindow(l); w > 0 {
					lo = max(0, pos-w+1)
				}
				sc := make([]float64, pos+1-lo)
				vh := make([][]float64, pos+1-lo)
				for j := range sc {
					var d float64
					for i := range hd {
						d += qs[h*hd+i] * ks[lo+j][kvh*hd+i]
					}
					sc[j] = d
					vh[j] = vs[lo+j][kvh*hd : (kvh+1)*hd]
				}
				// The bf16 attention path rounds the softmax weights to
				// bf16 (attention.go); so does the reference then.
				copy(att[h*hd:], refSoftmaxValues(sc, vh, r.roundKV && tensor.AttnBF16()))
			}
			o := refLinear(wo, H, qd, att, bo, rx(p+"self_attn.o_proj.weight"))
			for i := range x {
				x[i] += o[i]
			}
			xn = refNorm(x, n2, c.RMSNormEps)
			g := refLinear(wg, F, H, xn, nil, rx(p+"mlp.gate_proj.weight"))
			u := refLinear(wu, F, H, xn, nil, rx(p+"mlp.up_proj.weight"))
			for i := range g {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
			d := refLinear(wd, H, F, g, nil, rx(p+"mlp.down_proj.weight"))
			for i := range x {
				x[i] += d[i]
			}
		}
	}
	head, headName := opt("lm_head.weight"), "lm_head.weight"
	if c.TieWordEmbeddings || head == nil {
		head, headName = emb, "model.embed_tokens.weight"
	}
	norm := get("model.norm.weight")
	out := make([][]float64, len(tokens))
	for i, x := range xs {
		out[i] = refLinear(head, c.Vocab, H, refNorm(x, norm, c.RMSNormEps), nil, rx(headName))
	}
	return out
}

// testSpec is a small model spec for the reference and invariance tests.
func testSpec(mod func(*modelinit.Spec)) modelinit.Spec {
	s := modelinit.Spec{
		ModelType: "llama", Hidden: 48, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16,
		Intermediate: 80, Vocab: 96, MaxPositions: 128, RMSNormEps: 1e-5, RopeTheta: 10000,
		BOS: 1, EOS: 2, DType: "f32", Std: 0.15, NormJitter: 0.3,
	}
	mod(&s)
	return s
}

func writeTestModel(t *testing.T, s modelinit.Spec) string {
	t.Helper()
	dir := t.TempDir()
	if err := modelinit.Write(dir, s, 7); err != nil {
		t.Fatalf("modelinit.Write: %v", err)
	}
	return dir
}

func loadTestModel(t *testing.T, dir string, threads int) *Model {
	t.Helper()
	pool := tensor.NewPool(threads)
	t.Cleanup(pool.Close)
	m, err := Load(dir, pool)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func randomTokens(r *rand.Rand, n, vocab int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(r.IntN(vocab))
	}
	return ids
}

func allIndexes(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

var referenceCases = []struct {
	name string
	spec modelinit.Spec
}{
	{"llama GQA f32 untied", testSpec(func(s *modelinit.Spec) {})},
	{"llama GQA bf16 tied", testSpec(func(s *modelinit.Spec) { s.DType = "bf16"; s.Tied = true })},
	{"qwen2 q/k/v biases bf16 tied", testSpec(func(s *modelinit.Spec) { s.ModelType = "qwen2"; s.DType = "bf16"; s.Tied = true })},
	{"qwen2 q/k/v biases bf16 untied", testSpec(func(s *modelinit.Spec) { s.ModelType = "qwen2"; s.DType = "bf16" })},
	{"llama attention_bias f16 untied with llama3 rope scaling", testSpec(func(s *modelinit.Spec) {
		s.AttentionBias = true
		s.DType = "f16"
		s.RopeScaling = modelinit.RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 64}
	})},
	{"mistral MHA f32 linear rope scaling", testSpec(func(s *modelinit.Spec) {
		s.ModelType = "mistral"
		s.KVHeads = 4
		s.RopeScaling = modelinit.RopeScaling{Type: "linear", Factor: 4}
	})},
	{"head_dim different from hidden/heads, one kv head", testSpec(func(s *modelinit.Spec) {
		s.Hidden, s.Heads, s.KVHeads, s.HeadDim = 40, 4, 1, 12
	})},
	// Sliding windows (over a 100-token prompt): one that starts inside
	// the second 64-key chunk's predecessor and one of 9 keys.
	{"mistral f32 window 67", testSpec(func(s *modelinit.Spec) { s.ModelType, s.SlidingWindow = "mistral", 67 })},
	{"mistral bf16 window 9", testSpec(func(s *modelinit.Spec) { s.ModelType, s.DType, s.SlidingWindow = "mistral", "bf16", 9 })},
}

// f32ActivationISA selects, for the rest of the test, the best kernel ISA
// that multiplies f32 activations (see tensor.BF16Activations): the
// float64 reference comparisons are tight, and rounding activations to bf16
// can flip one rounding between the reference's float64 input and the
// model's float32 one. TestBF16ModelsNearReference covers the
// rounding ISA.
func f32ActivationISA(t *testing.T) {
	t.Helper()
	if !tensor.BF16Activations() {
		return
	}
	def := tensor.ISA()
	t.Cleanup(func() { _ = tensor.SetISA(def) })
	for _, isa := range tensor.ISAs() {
		if err := tensor.SetISA(isa); err != nil {
			t.Fatal(err)
		}
		if !tensor.BF16Activations() {
			return
		}
	}
	t.Fatal("no ISA multiplies f32 activations")
}

// referenceDiff runs spec's model with a KV pool of kvDType on 21 random
// tokens and returns the largest
// logit difference to the float64 reference, relative to the largest
// logit, and the mean squared difference relative to the mean squared
// logit.
func referenceDiff(t *testing.T, spec modelinit.Spec, kvDType kvlayout.ElemType) (maxRel, msRel float64) {
	t.Helper()
	dir := writeTestModel(t, spec)
	m := loadTestModel(t, dir, 2)
	ref := newRefModel(t, dir)
	ref.roundKV = kvDType == kvlayout.BF16
	r := rand.New(rand.NewPCG(1, 2))
	n := 21
	if spec.SlidingWindow > 0 {
		n = 100 // past the window and across a 64-key chunk boundary
	}
	tokens := randomTokens(r, n, spec.Vocab)
	want := ref.logits(t, tokens)

	layout := m.KVLayoutOf(4, kvDType)
	kv, blocks := contiguous(layout, len(tokens))
	out, err := m.Forward([]Seq{{Tokens: tokens, Blocks: blocks, Logits: allIndexes(len(tokens))}}, kv, layout)
	if err != nil {
		t.Fatal(err)
	}
	V := m.VocabSize()
	var maxAbs, maxDiff, ss, sd float64
	for p := range tokens {
		for j := range V {
			w := want[p][j]
			d := float64(out[0][p*V+j]) - w
			maxAbs = max(maxAbs, math.Abs(w))
			maxDiff = max(maxDiff, math.Abs(d))
			ss += w * w
			sd += d * d
		}
	}
	if maxAbs < 0.5 {
		t.Fatalf("reference logits are degenerate (max |logit| %g): the test model is too weak to test anything", maxAbs)
	}
	return maxDiff / maxAbs, sd / ss
}

func TestForwardMatchesFloat64Reference(t *testing.T) {
	f32ActivationISA(t)
	for _, tc := range referenceCases {
		t.Run(tc.name, func(t *testing.T) {
			if rel, _ := referenceDiff(t, tc.spec, kvlayout.F32); rel > 1e-4 {
				t.Errorf("max |Δlogit| relative to max |logit|: %g > 1e-4", rel)
			}
		})
	}
}

// TestBF16ModelsNearReference checks the bf16 models as served, with their
// default bf16 KV pool, under every ISA (avx512bf16 also rounds
// activations to bf16, see tensor.BF16Activations). The reference rounds
// the same values, and the only differences left are the rare values whose
// float64 and float32 versions round to different bf16 neighbours.
func TestBF16ModelsNearReference(t *testing.T) {
	def := tensor.ISA()
	t.Cleanup(func() { _ = tensor.SetISA(def) })
	for _, isa := range tensor.ISAs() {
		if err := tensor.SetISA(isa); err != nil {
			t.Fatal(err)
		}
		for _, tc := range referenceCases {
			if tc.spec.DType != "bf16" {
				continue
			}
			t.Run(isa+"/"+tc.name, func(t *testing.T) {
				maxRel, msRel := referenceDiff(t, tc.spec, kvlayout.BF16)
				t.Logf("max |Δlogit| / max |logit| = %.3g, Σ Δ² / Σ logit² = %.3g", maxRel, msRel)
				if maxRel > 5e-2 || msRel > 1e-4 {
					t.Errorf("logits too far from the reference: max relative %g (limit 5e-2), mean-square relative %g (limit 1e-4)", maxRel, msRel)
				}
			})
		}
	}
}
