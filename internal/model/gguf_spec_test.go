package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/gguf/ggufspec"
	"github.com/tandem-serve/tandem/internal/model/safetensors"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// specModel is a tiny llama with random weights in Hugging Face layout,
// and the vocabulary of a small SentencePiece tokenizer.
type specModel struct {
	hidden, heads, kvHeads, headDim, ffn, layers int
	tokens                                       []string
	scores                                       []float32
	types                                        []int32
	w                                            map[string][]float32 // Hugging Face name → values
	shapes                                       map[string][]int
}

func newSpecModel() *specModel {
	m := &specModel{hidden: 64, heads: 4, kvHeads: 2, headDim: 16, ffn: 96, layers: 2,
		w: map[string][]float32{}, shapes: map[string][]int{}}
	add := func(tok string, score float32, typ int32) {
		m.tokens, m.scores, m.types = append(m.tokens, tok), append(m.scores, score), append(m.types, typ)
	}
	add("<unk>", 0, 2)
	add("<s>", 0, 3)
	add("</s>", 0, 3)
	for b := range 256 {
		add(fmt.Sprintf("<0x%02X>", b), 0, 6)
	}
	add("▁", -60, 1)
	for c := 'a'; c <= 'z'; c++ {
		add(string(c), -100, 1)
		add("▁"+string(c), -50, 1)
	}
	for _, p := range []string{"th", "he", "at", "in", "an"} {
		add(p, -10, 1)
	}
	add("▁th", -5, 1)
	add("▁the", -1, 1)
	for i := 0; len(m.tokens) < 320; i++ {
		add(fmt.Sprintf("▁w%d", i), -200, 1)
	}
	r := rand.New(rand.NewPCG(11, 12))
	mat := func(name string, rows, cols int, std float64) {
		v := make([]float32, rows*cols)
		for i := range v {
			v[i] = float32(r.NormFloat64() * std)
		}
		m.w[name], m.shapes[name] = v, []int{rows, cols}
	}
	norm := func(name string) {
		v := make([]float32, m.hidden)
		for i := range v {
			v[i] = float32(1 + 0.2*r.NormFloat64())
		}
		m.w[name], m.shapes[name] = v, []int{m.hidden}
	}
	V, H, qd, kvd := len(m.tokens), m.hidden, m.heads*m.headDim, m.kvHeads*m.headDim
	mat("model.embed_tokens.weight", V, H, 1)
	mat("lm_head.weight", V, H, 0.2)
	norm("model.norm.weight")
	for i := range m.layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		norm(p + "input_layernorm.weight")
		norm(p + "post_attention_layernorm.weight")
		mat(p+"self_attn.q_proj.weight", qd, H, 0.2)
		mat(p+"self_attn.k_proj.weight", kvd, H, 0.2)
		mat(p+"self_attn.v_proj.weight", kvd, H, 0.2)
		mat(p+"self_attn.o_proj.weight", H, qd, 0.2)
		mat(p+"mlp.gate_proj.weight", m.ffn, H, 0.2)
		mat(p+"mlp.up_proj.weight", m.ffn, H, 0.2)
		mat(p+"mlp.down_proj.weight", H, m.ffn, 0.2)
	}
	return m
}

// q8_0 is the dequantized value of x after Q8_0 quantization, computed
// from the block definition (d = max|x|/127 rounded to f16, q = round(x/d)).
func q8Dequant(xs []float32) []float32 {
	b := ggufspec.Q8_0(xs)
	out := make([]float32, len(xs))
	for blk := range len(xs) / 32 {
		h := binary.LittleEndian.Uint16(b[34*blk:])
		d := f16Value(h)
		for i := range 32 {
			out[32*blk+i] = float32(int8(b[34*blk+2+i])) * d
		}
	}
	return out
}

func f16Value(h uint16) float32 {
	e := int(h>>10) & 31
	m := float64(h & 1023)
	if e == 0 {
		return float32(m * math.Pow(2, -24))
	}
	return float32((1024 + m) * math.Pow(2, float64(e-25)))
}

// ggufFile builds the model as a GGUF file byte by byte from the format
// specification: llama.cpp's names and keys, q and k rows permuted as its
// converter does (row 2i+j of a head is Hugging Face row j·d/2+i), the
// tensors deliberately out of llama.cpp's order, and the matrices in quant
// (Hugging Face names) as Q8_0, the rest F32.
func (m *specModel) ggufFile(t *testing.T, quant map[string]bool) string {
	t.Helper()
	type tensor struct {
		name string
		typ  uint32
		dims []uint64
		data []byte
	}
	permute := func(v []float32, heads, cols int) []float32 {
		out := make([]float32, len(v))
		hd := m.headDim
		for h := range heads {
			for i := range hd / 2 {
				for j := range 2 {
					src, dst := h*hd+j*hd/2+i, h*hd+2*i+j
					copy(out[dst*cols:(dst+1)*cols], v[src*cols:(src+1)*cols])
				}
			}
		}
		return out
	}
	var ts []tensor
	names := make([]string, 0, len(m.w))
	for n := range m.w {
		names = append(names, n)
	}
	slices.Sort(names) // name order: q, k and v are not adjacent
	for _, hf := range names {
		v, shape := m.w[hf], m.shapes[hf]
		g, _ := ggufName(hf, "llama")
		cols := shape[len(shape)-1]
		switch {
		case strings.HasSuffix(hf, "q_proj.weight"):
			v = permute(v, m.heads, cols)
		case strings.HasSuffix(hf, "k_proj.weight"):
			v = permute(v, m.kvHeads, cols)
		}
		dims := []uint64{uint64(cols)}
		if len(shape) == 2 {
			dims = append(dims, uint64(shape[0]))
		}
		if quant[hf] {
			ts = append(ts, tensor{g, ggufspec.GQ8_0, dims, ggufspec.Q8_0(v)})
		} else {
			ts = append(ts, tensor{g, ggufspec.GF32, dims, ggufspec.F32s(v)})
		}
	}
	b := &ggufspec.Builder{}
	b.Header(3, uint64(len(ts)), 20)
	b.KVString("general.architecture", "llama")
	b.KVString("general.name", "spec-llama")
	b.KVU32("llama.context_length", 128)
	b.KVU32("llama.embedding_length", uint32(m.hidden))
	b.KVU32("llama.block_count", uint32(m.layers))
	b.KVU32("llama.feed_forward_length", uint32(m.ffn))
	b.KVU32("llama.rope.dimension_count", uint32(m.headDim))
	b.KVU32("llama.attention.head_count", uint32(m.heads))
	b.KVU32("llama.attention.head_count_kv", uint32(m.kvHeads))
	b.KVF32("llama.attention.layer_norm_rms_epsilon", 1e-5)
	b.KVF32("llama.rope.freq_base", 10000)
	b.KVString("tokenizer.ggml.model", "llama")
	b.KVStrings("tokenizer.ggml.tokens", m.tokens)
	b.KVF32s("tokenizer.ggml.scores", m.scores)
	b.KVI32s("tokenizer.ggml.token_type", m.types)
	b.KVU32("tokenizer.ggml.bos_token_id", 1)
	b.KVU32("tokenizer.ggml.eos_token_id", 2)
	b.KVU32("tokenizer.ggml.unknown_token_id", 0)
	b.KVBool("tokenizer.ggml.add_bos_token", true)
	b.KVString("tokenizer.chat_template", "{% for m in messages %}{{ m.content }} {% endfor %}")
	var off uint64
	for _, tn := range ts {
		b.TensorInfo(tn.name, tn.typ, tn.dims, off)
		off += uint64(len(tn.data)+31) / 32 * 32
	}
	b.Pad(32)
	for _, tn := range ts {
		b.Raw(tn.data).Pad(32)
	}
	path := filepath.Join(t.TempDir(), "spec.gguf")
	if err := os.WriteFile(path, b.B, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkpoint writes the model as a Hugging Face checkpoint, with the
// matrices in quant replaced by their Q8_0-dequantized values.
func (m *specModel) checkpoint(t *testing.T, quant map[string]bool) string {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`{"model_type": "llama", "hidden_size": %d, "num_hidden_layers": %d, "num_attention_heads": %d,
		"num_key_value_heads": %d, "intermediate_size": %d, "vocab_size": %d, "max_position_embeddings": 128,
		"rms_norm_eps": 1e-5, "rope_theta": 10000, "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2}`,
		m.hidden, m.layers, m.heads, m.kvHeads, m.ffn, len(m.tokens))
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var infos []safetensors.Info
	var data [][]byte
	for name, v := range m.w {
		if quant[name] {
			v = q8Dequant(v)
		}
		infos = append(infos, safetensors.Info{Name: name, DType: safetensors.F32, Shape: m.shapes[name]})
		data = append(data, ggufspec.F32s(v))
	}
	f, err := os.Create(filepath.Join(dir, safetensors.SingleFile))
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
	return dir
}

// TestSpecBuiltGGUF loads GGUF files written byte by byte from the format
// specification (not by our writer): all F32, which must compute exactly
// what the Hugging Face checkpoint of the same weights computes, and with
// the q, v, gate, up and output matrices in Q8_0, which must come within 2%
// of the checkpoint holding the dequantized blocks; its tokenizer must
// segment as SentencePiece does, and the model must generate.
func TestSpecBuiltGGUF(t *testing.T) {
	sm := newSpecModel()
	tokens := []int32{1, 270, 300, 5, 290, 311, 319, 280, 259, 301}

	f32 := loadTestModel(t, sm.ggufFile(t, nil), 2)
	want := logitsOf(t, loadTestModel(t, sm.checkpoint(t, nil), 2), tokens)
	got := logitsOf(t, f32, tokens)
	for p := range want {
		if !sameBits(got[p], want[p]) {
			t.Fatalf("all-F32 file: position %d differs from the checkpoint (max rel diff %g)", p, relDiff(got, want))
		}
	}

	quant := map[string]bool{"lm_head.weight": true}
	for i := range sm.layers {
		for _, n := range []string{"self_attn.v_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "self_attn.q_proj.weight"} {
			quant[fmt.Sprintf("model.layers.%d.%s", i, n)] = true
		}
	}
	path := sm.ggufFile(t, quant)
	q := loadTestModel(t, path, 2)
	if q.layers[0].o.DType.String() != "f32" || q.lmHead.DType.String() != "q8_0" || q.cfg.TieWordEmbeddings {
		t.Errorf("attn_output %s, output %s, tied %t", q.layers[0].o.DType, q.lmHead.DType, q.cfg.TieWordEmbeddings)
	}
	twin := logitsOf(t, loadTestModel(t, sm.checkpoint(t, quant), 2), tokens)
	if d := relDiff(logitsOf(t, q, tokens), twin); d > 0.02 {
		t.Errorf("mixed file: max |Δlogit| / max |logit| against the dequantized checkpoint = %.4f > 0.02", d)
	}

	tok, err := tokenizer.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode("the cat", true)
	wantIDs := []int32{1, idOf(t, sm, "▁the"), idOf(t, sm, "▁c"), idOf(t, sm, "at")}
	if !slices.Equal(ids, wantIDs) {
		t.Errorf("Encode(the cat) = %v, want %v (<s> ▁the ▁c at)", ids, wantIDs)
	}
	if !tok.HasChatTemplate() || tok.VocabSize() != q.VocabSize() {
		t.Errorf("chat template %t, vocab %d (model %d)", tok.HasChatTemplate(), tok.VocabSize(), q.VocabSize())
	}
	out := greedy(t, q, ids, 8)
	for _, id := range out {
		if id < 0 || int(id) >= q.VocabSize() {
			t.Fatalf("generated id %d outside the vocabulary", id)
		}
	}
	if text := tok.Decode(out, true); len(text) == 0 {
		t.Errorf("generated %v decodes to nothing", out)
	}
	if c := q.Config(); c.Layers != 2 || c.BOS[0] != 1 || c.EOS[0] != 2 || c.MaxPositions != 128 {
		t.Errorf("config %+v", c)
	}
}

func idOf(t *testing.T, m *specModel, tok string) int32 {
	t.Helper()
	i := slices.Index(m.tokens, tok)
	if i < 0 {
		t.Fatalf("no token %q", tok)
	}
	return int32(i)
}
