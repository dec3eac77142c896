package model

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/model/safetensors"
	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// rewriteWeights rewrites dir/model.safetensors through edit, which may
// drop tensors (return false) or change their declared dtype and shape.
// Data is written as zeros of the declared size.
func rewriteWeights(t *testing.T, dir string, edit func(*safetensors.Info) bool) {
	t.Helper()
	path := filepath.Join(dir, safetensors.SingleFile)
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var infos []safetensors.Info
	for _, info := range f.Header().Tensors {
		if edit(&info) {
			infos = append(infos, info)
		}
	}
	f.Close()
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	w, err := safetensors.NewWriter(out, infos, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		if _, err := w.Write(make([]byte, info.Elements()*int64(info.DType.Size()))); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func editConfig(t *testing.T, dir, old, new string) {
	t.Helper()
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), old) {
		t.Fatalf("config.json has no %q", old)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(data), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadReportsWhatIsWrong(t *testing.T) {
	const q = "model.layers.1.self_attn.q_proj.weight"
	cases := []struct {
		name   string
		spec   func(*modelinit.Spec)
		break_ func(t *testing.T, dir string)
		want   []string // substrings of the error
	}{
		{"missing tensor names it and its shape", nil, func(t *testing.T, dir string) {
			rewriteWeights(t, dir, func(i *safetensors.Info) bool { return i.Name != q })
		}, []string{q, "missing", "[64 48]"}},
		{"mis-shaped tensor names expected and found shapes", nil, func(t *testing.T, dir string) {
			rewriteWeights(t, dir, func(i *safetensors.Info) bool {
				if i.Name == q {
					i.Shape = []int{48, 64}
				}
				return true
			})
		}, []string{q, "expected shape [64 48]", "found [48 64]"}},
		{"unsupported dtype names tensor and dtype", nil, func(t *testing.T, dir string) {
			rewriteWeights(t, dir, func(i *safetensors.Info) bool {
				if i.Name == q {
					i.DType = safetensors.I32
				}
				return true
			})
		}, []string{q, "I32", "not supported"}},
		{"untied model without lm_head", func(s *modelinit.Spec) { s.Tied = false }, func(t *testing.T, dir string) {
			rewriteWeights(t, dir, func(i *safetensors.Info) bool { return i.Name != "lm_head.weight" })
		}, []string{"lm_head.weight", "missing", "tie_word_embeddings false"}},
		{"unsupported model_type", nil, func(t *testing.T, dir string) {
			editConfig(t, dir, `"model_type": "llama"`, `"model_type": "gemma2"`)
		}, []string{"model_type", "gemma2", "not supported", "llama, mistral, mixtral, qwen2, qwen3, qwen3_moe"}},
		{"unsupported architecture", nil, func(t *testing.T, dir string) {
			editConfig(t, dir, `"LlamaForCausalLM"`, `"LlamaForSequenceClassification"`)
		}, []string{"architectures", "LlamaForSequenceClassification", "not supported", "LlamaForCausalLM"}},
		{"unsupported rope type in rope_parameters", nil, func(t *testing.T, dir string) {
			editConfig(t, dir, `"rope_scaling": null`, `"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000, "factor": 4}`)
		}, []string{"rope_parameters", "yarn", "not supported"}},
		{"unsupported activation", nil, func(t *testing.T, dir string) {
			editConfig(t, dir, `"hidden_act": "silu"`, `"hidden_act": "gelu"`)
		}, []string{"hidden_act", "gelu"}},
		{"unsupported rope scaling", nil, func(t *testing.T, dir string) {
			editConfig(t, dir, `"rope_scaling": null`, `"rope_scaling": {"type": "yarn", "factor": 4}`)
		}, []string{"rope_type", "yarn"}},
		{"wrong-typed field", nil, func(t *testing.T, dir string) {
			editConfig(t, dir, `"hidden_size": 48`, `"hidden_size": "48"`)
		}, []string{"hidden_size", "expected a positive integer", `found "48"`}},
		{"truncated weights file", nil, func(t *testing.T, dir string) {
			path := filepath.Join(dir, safetensors.SingleFile)
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, st.Size()-100); err != nil {
				t.Fatal(err)
			}
		}, []string{"model.safetensors", "truncated"}},
		{"missing weights", nil, func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, safetensors.SingleFile)); err != nil {
				t.Fatal(err)
			}
		}, []string{"model.safetensors", "model.safetensors.index.json"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := testSpec(func(s *modelinit.Spec) { s.Tied = true })
			if tc.spec != nil {
				tc.spec(&spec)
			}
			dir := writeTestModel(t, spec)
			tc.break_(t, dir)
			m, err := Load(dir, tensor.NewPool(1))
			if err == nil {
				m.Close()
				t.Fatal("Load succeeded on a broken model")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestForwardRejectsBadInput(t *testing.T) {
	dir := writeTestModel(t, testSpec(func(s *modelinit.Spec) {}))
	m := loadTestModel(t, dir, 1)
	layout := m.KVLayout(4)
	kv, blocks := contiguous(layout, 16) // 4 blocks
	ok := func() Seq { return Seq{Tokens: []int32{1, 2, 3}, Pos: 0, Blocks: blocks, Logits: []int{2}} }
	cases := []struct {
		name   string
		seqs   func() []Seq
		kv     []byte
		layout kvlayout.Layout
		want   string
	}{
		{"no sequences", func() []Seq { return nil }, kv, layout, "at least one sequence"},
		{"empty sequence", func() []Seq { s := ok(); s.Tokens = nil; s.Logits = nil; return []Seq{s} }, kv, layout, "no new tokens"},
		{"short block table", func() []Seq { s := ok(); s.Pos = 14; s.Blocks = blocks[:4]; return []Seq{s} }, kv, layout, "needs 5 blocks"},
		{"block id past the pool", func() []Seq { s := ok(); s.Blocks = []int32{4}; return []Seq{s} }, kv, layout, "block 4, outside the pool's 4 blocks"},
		{"negative block id", func() []Seq { s := ok(); s.Blocks = []int32{-1}; return []Seq{s} }, kv, layout, "block -1"},
		{"token outside vocabulary", func() []Seq { s := ok(); s.Tokens = []int32{1, 96, 3}; return []Seq{s} }, kv, layout, "id 96, outside the vocabulary of 96"},
		{"position past max", func() []Seq { s := ok(); s.Pos = 126; return []Seq{s} }, make([]byte, 32*layout.BlockBytes()), layout, "outside the model's 128 positions"},
		{"negative position", func() []Seq { s := ok(); s.Pos = -1; return []Seq{s} }, kv, layout, "positions [-1, 2)"},
		{"logits index out of range", func() []Seq { s := ok(); s.Logits = []int{3}; return []Seq{s} }, kv, layout, "logits of token 3"},
		{"layout of another model", func() []Seq { return []Seq{ok()} }, kv, kvlayout.Layout{BlockSize: 4, Layers: 3, KVHeads: 2, HeadDim: 16}, "does not match the model"},
		{"KV neither f32 nor bf16", func() []Seq { return []Seq{ok()} }, kv, m.KVLayoutOf(4, kvlayout.ElemType(2)), "dtype f32 or bf16"},
		{"zero block size", func() []Seq { return []Seq{ok()} }, kv, m.KVLayout(0), "positive block size"},
		{"pool not whole blocks", func() []Seq { return []Seq{ok()} }, kv[:len(kv)-1], layout, "not a whole number"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.Forward(tc.seqs(), tc.kv, tc.layout)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Forward error = %v, want one containing %q", err, tc.want)
			}
		})
	}
	m.Close()
	if _, err := m.Forward([]Seq{ok()}, kv, layout); err == nil || !strings.Contains(err.Error(), "after Close") {
		t.Errorf("Forward after Close = %v, want an error", err)
	}
}

func TestModelReportsItsShape(t *testing.T) {
	spec := testSpec(func(s *modelinit.Spec) { s.DType = "bf16"; s.Tied = true })
	dir := writeTestModel(t, spec)
	m := loadTestModel(t, dir, 1)
	if got, want := m.NumParams(), spec.NumParams(); got != want {
		t.Errorf("NumParams = %d, want %d", got, want)
	}
	if got, want := m.WeightBytes(), 2*spec.NumParams(); got != want {
		t.Errorf("WeightBytes = %d, want %d", got, want)
	}
	if m.DType() != tensor.BF16 || m.VocabSize() != 96 || m.MaxModelLen() != 128 {
		t.Errorf("DType, VocabSize, MaxModelLen = %v, %d, %d; want bf16, 96, 128", m.DType(), m.VocabSize(), m.MaxModelLen())
	}
	if l := m.KVLayout(16); l != (kvlayout.Layout{BlockSize: 16, Layers: 2, KVHeads: 2, HeadDim: 16, DType: kvlayout.BF16}) {
		t.Errorf("KVLayout(16) = %+v", l)
	}
	for i, l := range m.layers {
		if !l.qkv.fused || !l.gateUp.fused {
			t.Errorf("layer %d: q/k/v fused %t, gate/up fused %t; modelinit lays them out adjacently so both should fuse", i, l.qkv.fused, l.gateUp.fused)
		}
	}
	if g := m.GenerationConfig(); len(g.EOS) != 1 || g.EOS[0] != 2 || g.Temperature != nil {
		t.Errorf("GenerationConfig = %+v, want EOS [2] and nothing else", g)
	}
}

func TestFingerprintIdentifiesWeights(t *testing.T) {
	spec := testSpec(func(s *modelinit.Spec) {})
	a := writeTestModel(t, spec)
	fp := func(dir string) string { return loadTestModel(t, dir, 1).Fingerprint() }
	base := fp(a)
	if len(base) != 64 {
		t.Fatalf("Fingerprint %q is not a hex SHA-256", base)
	}
	if again := fp(writeTestModel(t, spec)); again != base {
		t.Errorf("same spec and seed: fingerprints %s and %s differ", base, again)
	}
	other := t.TempDir()
	if err := modelinit.Write(other, spec, 8); err != nil {
		t.Fatal(err)
	}
	if fp(other) == base {
		t.Error("different seed gave the same fingerprint")
	}
	eps := writeTestModel(t, spec)
	editConfig(t, eps, `"rms_norm_eps": 0.00001`, `"rms_norm_eps": 0.000001`)
	if fp(eps) == base {
		t.Error("different rms_norm_eps gave the same fingerprint")
	}
	// The kernel set is not part of it: engines on different CPUs serve
	// the same model and exchange KV.
	def := tensor.ISA()
	t.Cleanup(func() { _ = tensor.SetISA(def) })
	m := loadTestModel(t, a, 1)
	for _, isa := range tensor.ISAs() {
		if err := tensor.SetISA(isa); err != nil {
			t.Fatal(err)
		}
		if got := m.Fingerprint(); got != base {
			t.Errorf("under kernels %s the fingerprint is %s (under %s: %s)", isa, got, def, base)
		}
	}
}
