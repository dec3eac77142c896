package model

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/tandem-serve/tandem/internal/gguf"
	"github.com/tandem-serve/tandem/internal/model/safetensors"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// GGUFEncodings are the weight encodings ConvertToGGUF writes, by name.
//
//   - f32, f16, bf16: every matrix in that type.
//   - q8_0, q4_0, q6_k: every matrix in that type, except that q4_0 puts the
//     output matrix (the embeddings when they are tied) in Q6_K, as
//     llama.cpp's quantizer does.
//   - q4_k_m, q5_k_m (llama.cpp's Q4_K_M and Q5_K_M mixes): Q4_K (Q5_K), with
//     Q6_K for the output matrix (or the tied embeddings) and for attn_v and
//     ffn_down in the layers i of n where i < n/8, i ≥ 7n/8 or (i − n/8) mod
//     3 = 2 (llama.cpp's use_more_bits), which is about half of them.
//
// Norm weights, biases and rope_freqs are always F32. A matrix whose rows
// cannot be cut into the chosen type's blocks falls back: a K-quant to Q8_0
// (rows of a multiple of 32 weights; llama.cpp picks Q5_0, Q5_1 or Q8_0,
// which Tandem does not all have), and Q8_0 or Q4_0 to F16, as llama.cpp
// falls back to F16.
var GGUFEncodings = []string{"f32", "f16", "bf16", "q8_0", "q4_0", "q6_k", "q4_k_m", "q5_k_m"}

// ggufFileTypes are llama.cpp's general.file_type values (llama_ftype).
var ggufFileTypes = map[string]uint32{"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18, "bf16": 32}

// GGUFOptions configures ConvertToGGUF.
type GGUFOptions struct {
	// Encoding is one of GGUFEncodings.
	Encoding string
	// Name is general.name; empty means the checkpoint directory's name.
	Name string
	// Metadata is written after the model's own keys: the tokenizer's
	// (tokenizer.GGUFMetadata).
	Metadata []gguf.KV
	// Threads quantize in parallel; 0 means GOMAXPROCS.
	Threads int
	// ReadProgress, when set, is told the bytes of the checkpoint read so
	// far and in all while it is read in (as LoadOptions.Progress).
	ReadProgress func(read, total int64)
	// Progress, when set, is told how far the conversion has come: once
	// before the first tensor and after each one is written.
	Progress func(GGUFProgress)
}

// GGUFProgress is how far ConvertToGGUF has come: tensors and bytes of
// tensor data written, so far and in all.
type GGUFProgress struct {
	Tensors, TotalTensors int
	Bytes, TotalBytes     int64
}

// GGUFSummary describes a converted file.
type GGUFSummary struct {
	// Tensors counts the tensors written by type.
	Tensors map[gguf.Type]int
	// Bytes is the size of the tensor data by type.
	Bytes map[gguf.Type]int64
}

// ggufEntry is one tensor of a conversion plan.
type ggufEntry struct {
	hf, name string
	shape    []int // Hugging Face order
	typ      gguf.Type
	permute  int       // heads to permute the rows of (llama q and k), 0 for none
	data     []float32 // set for tensors computed here (rope_freqs)
	// stack, when set, are the Hugging Face tensors (one per expert)
	// stacked into this one, in order.
	stack []string
}

// ggufContextLength is the context_length written for c: its positions,
// or for a model with sliding-window layers the window if smaller. GGUF's
// llama, qwen2 and qwen3 architectures have no window (llama.cpp attends
// to every position), so the file is limited to the positions where full
// and windowed attention agree; gemma3 files keep their window
// (attention.sliding_window).
func ggufContextLength(c *Config) int {
	if c.SlidingWindow > 0 && c.SlidingWindow < c.MaxPositions && c.ModelType != "gemma3_text" {
		return c.SlidingWindow
	}
	return c.MaxPositions
}

// ggufGemmaPattern is the period of llama.cpp's gemma3 layers: every
// pattern-th layer is global, unless attention.sliding_window_pattern says
// otherwise.
const ggufGemmaPattern = 6

// ggufGemmaFits checks that a gemma3_text model is what a gemma3 GGUF file
// can describe: llama.cpp's gemma3 takes the local layers' RoPE base to be
// 10000 and the attention scale to be head_dim^-½ (hidden/heads for the
// 62-layer 27B), as every released Gemma 3 has them, and the global layers
// to be every pattern-th. Anything else is refused rather than written as
// a file llama.cpp would run differently.
func ggufGemmaFits(c *Config) error {
	if c.ModelType != "gemma3_text" {
		return nil
	}
	g := c.Gemma
	if g.LocalRopeTheta != 10000 {
		return fmt.Errorf("model: a Gemma 3 with a local RoPE base of %v cannot be written to GGUF (llama.cpp's gemma3 assumes 10000); serve the safetensors checkpoint instead", g.LocalRopeTheta)
	}
	if g.QueryScalar != ggufGemmaQueryScalar(c) {
		return fmt.Errorf("model: a Gemma 3 with query_pre_attn_scalar %v cannot be written to GGUF (llama.cpp's gemma3 derives %v from its shape); serve the safetensors checkpoint instead", g.QueryScalar, ggufGemmaQueryScalar(c))
	}
	if c.SlidingWindow > 0 {
		if n, ok := ggufGemmaPeriod(c); !ok || (n != ggufGemmaPattern && n <= c.Layers) {
			return fmt.Errorf("model: a Gemma 3 whose global layers %v are not every %dth layer cannot be written to GGUF (llama.cpp's gemma3 assumes that pattern); serve the safetensors checkpoint instead", c.FullLayers, ggufGemmaPattern)
		}
	}
	return nil
}

// ggufSmolLM3NoRope is the period of llama.cpp's smollm3 layers without
// RoPE: every 4th (fixed in llama.cpp; the file has no key for it).
const ggufSmolLM3NoRope = 4

// ggufSmolLM3Fits checks that a smollm3 model's layers without RoPE are
// every ggufSmolLM3NoRope-th, the only pattern a smollm3 GGUF file can
// describe; anything else is refused rather than written as a file
// llama.cpp (and Tandem) would run with RoPE in the wrong layers.
func ggufSmolLM3Fits(c *Config) error {
	if c.ModelType != "smollm3" {
		return nil
	}
	if !slices.Equal(c.NoRopeLayers, ggufSmolLM3NoRopeLayers(c.Layers)) {
		return fmt.Errorf("model: a SmolLM3 whose layers without RoPE are %v (not every %dth) cannot be written to GGUF (llama.cpp's smollm3 assumes that pattern); serve the safetensors checkpoint instead", c.NoRopeLayers, ggufSmolLM3NoRope)
	}
	return nil
}

// ggufSmolLM3NoRopeLayers are the layers without RoPE of a smollm3 GGUF
// file of n layers.
func ggufSmolLM3NoRopeLayers(n int) []int {
	var layers []int
	for i := range n {
		if (i+1)%ggufSmolLM3NoRope == 0 {
			layers = append(layers, i)
		}
	}
	return layers
}

// ggufGemmaQueryScalar is the query_pre_attn_scalar llama.cpp's gemma3
// derives: hidden/heads for the 62-layer 27B, head_dim otherwise.
func ggufGemmaQueryScalar(c *Config) float64 {
	if c.Layers == 62 {
		return float64(c.Hidden / c.Heads)
	}
	return float64(c.HeadDim)
}

// ggufGemmaPeriod returns n when c's global layers are exactly every n-th
// layer (n > Layers: none is).
func ggufGemmaPeriod(c *Config) (int, bool) {
	n := c.Layers + 1
	if len(c.FullLayers) > 0 {
		n = c.FullLayers[0] + 1
	}
	for i := range c.Layers {
		if slices.Contains(c.FullLayers, i) != ((i+1)%n == 0) {
			return 0, false
		}
	}
	return n, true
}

// ConvertToGGUF writes the Hugging Face checkpoint in dir (llama, mistral,
// mixtral, qwen2, qwen3, qwen3_moe, gemma3_text, smollm3 or phi3; safetensors in
// f32, bf16 or f16) to w as a
// GGUF file with the
// weights in opts.Encoding, the way llama.cpp's convert_hf_to_gguf.py and
// llama-quantize would: llama.cpp's tensor names and {arch}.* keys
// (Mistral is written as llama; a model with a sliding window gets
// context_length limited to the window, see ggufContextLength), the q and k rows of llama and mistral
// permuted to llama.cpp's rotary layout (smollm3's too, as llama.cpp's
// converter does), phi3's fused attn_qkv and ffn_up kept fused with its
// longrope factors as rope_factors_short/long tensors, Llama 3 rope scaling as a
// rope_freqs tensor, output.weight omitted when the embeddings are tied,
// the experts of a qwen3_moe or mixtral layer (Mixtral is written as llama
// with experts, as llama.cpp's converter does) stacked into ffn_{gate,up,down}_exps
// and its router (ffn_gate_inp) kept in F32.
// The quantized blocks are those of tensor.QuantizeRows (llama.cpp's
// reference quantizers, without an importance matrix).
func ConvertToGGUF(dir string, w io.Writer, opts GGUFOptions) (*GGUFSummary, error) {
	enc := strings.ToLower(opts.Encoding)
	if _, ok := ggufFileTypes[enc]; !ok {
		return nil, fmt.Errorf("model: unknown GGUF encoding %q (want one of %s)", opts.Encoding, strings.Join(GGUFEncodings, ", "))
	}
	if gguf.IsFile(dir) {
		return nil, fmt.Errorf("model: %s is already a GGUF file: convert from the Hugging Face checkpoint directory", dir)
	}
	c, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	set, err := safetensors.OpenDirProgress(dir, opts.ReadProgress)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	defer set.Close()
	arch := map[string]string{"llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "gemma3_text": "gemma3", "smollm3": "smollm3", "phi3": "phi3"}[c.ModelType]
	if arch == "" {
		return nil, fmt.Errorf("model: converting model type %s to GGUF is not supported; serve the safetensors checkpoint instead", c.ModelType)
	}
	if err := ggufGemmaFits(c); err != nil {
		return nil, err
	}
	if err := ggufSmolLM3Fits(c); err != nil {
		return nil, err
	}
	if c.RopeScaling.Type != "" && c.RopeScaling.Type != "linear" && c.RopeScaling.Type != "llama3" && (c.RopeScaling.Type != "longrope" || arch != "phi3") {
		return nil, fmt.Errorf("model: rope scaling %q cannot be written to GGUF", c.RopeScaling.Type)
	}
	plan, err := ggufPlan(c, set, enc, arch == "llama" || arch == "smollm3")
	if err != nil {
		return nil, err
	}
	name := opts.Name
	if name == "" {
		name = filepath.Base(filepath.Clean(dir))
	}
	kv := ggufModelKV(c, arch, name, enc, plan)
	seen := map[string]bool{}
	for _, p := range kv {
		seen[p.Key] = true
	}
	for _, p := range opts.Metadata {
		if seen[p.Key] {
			return nil, fmt.Errorf("model: metadata key %q is written by the converter itself", p.Key)
		}
		kv = append(kv, p)
	}
	infos := make([]gguf.TensorInfo, len(plan))
	for i, e := range plan {
		dims := make([]int64, len(e.shape))
		for k, d := range e.shape {
			dims[len(e.shape)-1-k] = int64(d)
		}
		infos[i] = gguf.TensorInfo{Name: e.name, Type: e.typ, Dims: dims}
	}
	gw, err := gguf.NewWriter(w, kv, infos)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	threads := opts.Threads
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	sum := &GGUFSummary{Tensors: map[gguf.Type]int{}, Bytes: map[gguf.Type]int64{}}
	prog := GGUFProgress{TotalTensors: len(plan)}
	for _, t := range gw.Tensors() {
		prog.TotalBytes += t.Size
	}
	if opts.Progress != nil {
		opts.Progress(prog)
	}
	for _, e := range plan {
		vals := e.data
		if e.stack != nil {
			vals = make([]float32, 0, shapeElems(e.shape))
			for _, hf := range e.stack {
				t, _ := set.Tensor(hf)
				one, err := widen(t)
				if err != nil {
					return nil, err
				}
				vals = append(vals, one...)
			}
		} else if vals == nil {
			t, _ := set.Tensor(e.hf)
			if vals, err = widen(t); err != nil {
				return nil, err
			}
		}
		if c.ModelType == "gemma3_text" && len(e.shape) == 1 && strings.HasSuffix(e.hf, "norm.weight") {
			// llama.cpp's gemma3 files store Gemma's norm factor 1 + w.
			vals = slices.Clone(vals)
			for i, v := range vals {
				vals[i] = 1 + v
			}
		}
		cols := e.shape[len(e.shape)-1]
		if e.permute > 0 {
			rowBytes := 4 * cols
			if len(e.shape) == 1 {
				rowBytes = 4
			}
			b := f32Bytes(vals)
			if err := permuteRows(b, e.permute, c.HeadDim, rowBytes, false); err != nil {
				return nil, fmt.Errorf("model: tensor %q: %w", e.hf, err)
			}
		}
		data, err := encodeTensor(e.typ, vals, len(vals)/cols, cols, threads)
		if err != nil {
			return nil, fmt.Errorf("model: tensor %q to %s: %w", e.hf, e.typ, err)
		}
		if _, err := gw.Write(data); err != nil {
			return nil, fmt.Errorf("model: %w", err)
		}
		sum.Tensors[e.typ]++
		sum.Bytes[e.typ] += int64(len(data))
		if opts.Progress != nil {
			prog.Tensors++
			prog.Bytes += int64(len(data))
			opts.Progress(prog)
		}
	}
	if err := gw.Close(); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	return sum, nil
}

// ggufPlan lists the tensors to write, checking the checkpoint's shapes.
func ggufPlan(c *Config, set *safetensors.Set, enc string, permute bool) ([]ggufEntry, error) {
	var plan []ggufEntry
	var err error
	check := func(hf string, shape []int) bool {
		if err != nil {
			return false
		}
		t, ok := set.Tensor(hf)
		if !ok {
			err = fmt.Errorf("model: tensor %q is missing (expected shape %s)", hf, shapeString(shape))
			return false
		}
		if !slices.Equal(t.Shape, shape) {
			err = fmt.Errorf("model: tensor %q: expected shape %s, found %s in %s", hf, shapeString(shape), shapeString(t.Shape), t.File)
			return false
		}
		return true
	}
	add := func(hf string, perm int, shape ...int) {
		if check(hf, shape) {
			name, _ := ggufName(hf, c.ModelType)
			plan = append(plan, ggufEntry{hf: hf, name: name, shape: shape, permute: perm})
		}
	}
	// addExperts stacks one matrix of every expert of a layer into one
	// [experts, rows, cols] tensor, as llama.cpp's converter does.
	names := moeNamesOf[c.ModelType]
	addExperts := func(p, part string, rows, cols int) {
		stack := make([]string, c.MoE.Experts)
		for x := range stack {
			stack[x] = p + fmt.Sprintf(names.expert, x) + part
			if !check(stack[x], []int{rows, cols}) {
				return
			}
		}
		name, _, _ := ggufExpert(stack[0])
		plan = append(plan, ggufEntry{hf: stack[0], name: name, shape: []int{c.MoE.Experts, rows, cols}, stack: stack})
	}
	qPerm, kPerm := 0, 0
	if permute {
		qPerm, kPerm = c.Heads, c.KVHeads
	}
	add("model.embed_tokens.weight", 0, c.Vocab, c.Hidden)
	for i := range c.Layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		add(p+"input_layernorm.weight", 0, c.Hidden)
		if c.ModelType == "phi3" {
			// Fused in the checkpoint and in llama.cpp's phi3 alike.
			add(p+"self_attn.qkv_proj.weight", 0, c.QDim()+2*c.KVDim(), c.Hidden)
			add(p+"self_attn.o_proj.weight", 0, c.Hidden, c.QDim())
			add(p+"post_attention_layernorm.weight", 0, c.Hidden)
			add(p+"mlp.gate_up_proj.weight", 0, 2*c.Intermediate, c.Hidden)
			add(p+"mlp.down_proj.weight", 0, c.Hidden, c.Intermediate)
			continue
		}
		add(p+"self_attn.q_proj.weight", qPerm, c.QDim(), c.Hidden)
		add(p+"self_attn.k_proj.weight", kPerm, c.KVDim(), c.Hidden)
		add(p+"self_attn.v_proj.weight", 0, c.KVDim(), c.Hidden)
		if c.QKVBias {
			add(p+"self_attn.q_proj.bias", qPerm, c.QDim())
			add(p+"self_attn.k_proj.bias", kPerm, c.KVDim())
			add(p+"self_attn.v_proj.bias", 0, c.KVDim())
		}
		add(p+"self_attn.o_proj.weight", 0, c.Hidden, c.QDim())
		if c.OBias {
			add(p+"self_attn.o_proj.bias", 0, c.Hidden)
		}
		if c.QKNorm {
			add(p+"self_attn.q_norm.weight", 0, c.HeadDim)
			add(p+"self_attn.k_norm.weight", 0, c.HeadDim)
		}
		add(p+"post_attention_layernorm.weight", 0, c.Hidden)
		if c.ModelType == "gemma3_text" {
			add(p+"pre_feedforward_layernorm.weight", 0, c.Hidden)
			add(p+"post_feedforward_layernorm.weight", 0, c.Hidden)
		}
		if c.SparseLayer(i) {
			add(p+names.router, 0, c.MoE.Experts, c.Hidden)
			addExperts(p, names.gate, c.MoE.Intermediate, c.Hidden)
			addExperts(p, names.up, c.MoE.Intermediate, c.Hidden)
			addExperts(p, names.down, c.Hidden, c.MoE.Intermediate)
			continue
		}
		add(p+"mlp.gate_proj.weight", 0, c.Intermediate, c.Hidden)
		add(p+"mlp.up_proj.weight", 0, c.Intermediate, c.Hidden)
		add(p+"mlp.down_proj.weight", 0, c.Hidden, c.Intermediate)
	}
	add("model.norm.weight", 0, c.Hidden)
	if !c.TieWordEmbeddings {
		add("lm_head.weight", 0, c.Vocab, c.Hidden)
	}
	if err != nil {
		return nil, err
	}
	if c.RopeScaling.Type == "llama3" {
		plan = append(plan, ggufEntry{name: ggufRopeFreqs, shape: []int{c.HeadDim / 2}, data: llama3RopeFactors(c)})
	}
	if rs := c.RopeScaling; rs.Type == "longrope" {
		plan = append(plan,
			ggufEntry{name: ggufRopeLong, shape: []int{len(rs.LongFactor)}, data: f32s(rs.LongFactor)},
			ggufEntry{name: ggufRopeShort, shape: []int{len(rs.ShortFactor)}, data: f32s(rs.ShortFactor)})
	}
	for i := range plan {
		e := &plan[i]
		layer, part, _ := ggufLayer(e.name)
		// llama.cpp keeps the router (ffn_gate_inp) in F32, like the norms.
		if len(e.shape) == 1 || part == "ffn_gate_inp.weight" {
			e.typ = gguf.F32
			continue
		}
		output := e.name == ggufOutput || e.name == ggufEmbed && c.TieWordEmbeddings
		e.typ = ggufFallback(ggufWeightType(enc, part, layer, c.Layers, output), e.shape[len(e.shape)-1])
	}
	return plan, nil
}

// ggufWeightType is the type of a matrix under an encoding, before the
// fallback for widths the type's blocks do not divide (see GGUFEncodings).
func ggufWeightType(enc, part string, layer, layers int, output bool) gguf.Type {
	switch enc {
	case "f32":
		return gguf.F32
	case "f16":
		return gguf.F16
	case "bf16":
		return gguf.BF16
	case "q8_0":
		return gguf.Q8_0
	case "q6_k":
		return gguf.Q6_K
	case "q4_0":
		if output {
			return gguf.Q6_K
		}
		return gguf.Q4_0
	}
	base := gguf.Q4_K
	if enc == "q5_k_m" {
		base = gguf.Q5_K
	}
	if output || (part == "attn_v.weight" || part == "ffn_down.weight" || part == "ffn_down_exps.weight") && useMoreBits(layer, layers) {
		return gguf.Q6_K
	}
	return base
}

// useMoreBits is llama.cpp's use_more_bits: the first and last eighth of
// the layers, and every third in between.
func useMoreBits(i, n int) bool { return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2 }

// ggufFallback replaces a type whose blocks do not divide rows of cols
// weights.
func ggufFallback(t gguf.Type, cols int) gguf.Type {
	if elems, _ := t.BlockSize(); cols%elems == 0 {
		return t
	}
	if t == gguf.Q4_K || t == gguf.Q5_K || t == gguf.Q6_K {
		return ggufFallback(gguf.Q8_0, cols)
	}
	return gguf.F16
}

// llama3RopeFactors are the per-frequency divisors of Llama 3 rope scaling,
// as llama.cpp's converter stores them in rope_freqs (computed in float64,
// as ropeInvFreq computes the frequencies themselves).
func llama3RopeFactors(c *Config) []float32 {
	plain := *c
	plain.RopeScaling = RopeScaling{}
	base := ropeInvFreq(&plain)
	scaled := ropeInvFreq(c)
	out := make([]float32, len(base))
	for i := range out {
		out[i] = float32(base[i] / scaled[i])
	}
	return out
}

func ggufModelKV(c *Config, arch, name, enc string, plan []ggufEntry) []gguf.KV {
	u32 := func(x int) gguf.Value { return gguf.Uint32Value(uint32(x)) }
	kv := []gguf.KV{
		{Key: "general.architecture", Value: gguf.StringValue(arch)},
		{Key: "general.name", Value: gguf.StringValue(name)},
		{Key: "general.file_type", Value: gguf.Uint32Value(ggufFileTypes[enc])},
	}
	for _, e := range plan {
		if e.typ.Quantized() {
			kv = append(kv, gguf.KV{Key: "general.quantization_version", Value: gguf.Uint32Value(2)})
			break
		}
	}
	kv = append(kv,
		gguf.KV{Key: arch + ".context_length", Value: u32(ggufContextLength(c))},
		gguf.KV{Key: arch + ".rope.dimension_count", Value: u32(c.RotaryDims())},
		gguf.KV{Key: arch + ".embedding_length", Value: u32(c.Hidden)},
		gguf.KV{Key: arch + ".block_count", Value: u32(c.Layers)},
		gguf.KV{Key: arch + ".feed_forward_length", Value: u32(c.Intermediate)},
		gguf.KV{Key: arch + ".attention.head_count", Value: u32(c.Heads)},
		gguf.KV{Key: arch + ".attention.head_count_kv", Value: u32(c.KVHeads)},
		gguf.KV{Key: arch + ".attention.key_length", Value: u32(c.HeadDim)},
		gguf.KV{Key: arch + ".attention.value_length", Value: u32(c.HeadDim)},
		gguf.KV{Key: arch + ".rope.freq_base", Value: gguf.Float32Value(float32(c.RopeTheta))},
		gguf.KV{Key: arch + ".attention.layer_norm_rms_epsilon", Value: gguf.Float32Value(float32(c.RMSNormEps))},
		gguf.KV{Key: arch + ".vocab_size", Value: u32(c.Vocab)},
	)
	if c.MoE.Experts > 0 {
		kv = append(kv,
			gguf.KV{Key: arch + ".expert_count", Value: u32(c.MoE.Experts)},
			gguf.KV{Key: arch + ".expert_used_count", Value: u32(c.MoE.TopK)},
			gguf.KV{Key: arch + ".expert_feed_forward_length", Value: u32(c.MoE.Intermediate)},
			gguf.KV{Key: arch + ".expert_weights_norm", Value: gguf.BoolValue(c.MoE.NormTopK)})
	}
	if c.ModelType == "gemma3_text" {
		if c.SlidingWindow > 0 {
			period, _ := ggufGemmaPeriod(c)
			kv = append(kv,
				gguf.KV{Key: arch + ".attention.sliding_window", Value: u32(c.SlidingWindow)},
				gguf.KV{Key: arch + ".attention.sliding_window_pattern", Value: u32(period)})
		}
		if sc := c.Gemma.FinalLogitSoftcap; sc > 0 {
			kv = append(kv, gguf.KV{Key: arch + ".final_logit_softcapping", Value: gguf.Float32Value(float32(sc))})
		}
	}
	if rs := c.RopeScaling; rs.Type == "longrope" {
		// As llama.cpp's converter writes Phi-3: the length the model
		// was extended to, the original one and the attention factor.
		for i := range kv {
			if kv[i].Key == arch+".context_length" {
				kv[i].Value = u32(int(math.Round(rs.Factor * float64(rs.OriginalMaxPositionEmbeddings))))
			}
		}
		kv = append(kv,
			gguf.KV{Key: arch + ".rope.scaling.attn_factor", Value: gguf.Float32Value(float32(rs.AttentionFactor))},
			gguf.KV{Key: arch + ".rope.scaling.original_context_length", Value: u32(rs.OriginalMaxPositionEmbeddings)})
	}
	if c.RopeScaling.Type == "linear" {
		kv = append(kv,
			gguf.KV{Key: arch + ".rope.scaling.type", Value: gguf.StringValue("linear")},
			gguf.KV{Key: arch + ".rope.scaling.factor", Value: gguf.Float32Value(float32(c.RopeScaling.Factor))})
	}
	return kv
}

// f32s narrows xs to float32.
func f32s(xs []float64) []float32 {
	out := make([]float32, len(xs))
	for i, x := range xs {
		out[i] = float32(x)
	}
	return out
}

func shapeElems(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// widen returns a safetensors tensor's values as f32.
func widen(t safetensors.Tensor) ([]float32, error) {
	n := int(t.Elements())
	out := make([]float32, n)
	switch t.DType {
	case safetensors.F32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
	case safetensors.BF16:
		for i := range out {
			out[i] = tensor.BF16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
	case safetensors.F16:
		for i := range out {
			out[i] = tensor.F16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
	default:
		return nil, fmt.Errorf("model: tensor %q: dtype %s is not supported (expected F32, BF16 or F16)", t.Name, t.DType)
	}
	return out, nil
}

// f32Bytes views xs as bytes in host order (for moving whole rows).
func f32Bytes(xs []float32) []byte {
	if len(xs) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(xs))), 4*len(xs))
}

// encodeTensor encodes rows×cols values as typ, quantizing row ranges in
// parallel.
func encodeTensor(typ gguf.Type, vals []float32, rows, cols, threads int) ([]byte, error) {
	dt, ok := ggufDType(typ)
	if !ok {
		return nil, errors.New("unsupported type")
	}
	switch dt {
	case tensor.F32:
		out := make([]byte, 4*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		}
		return out, nil
	case tensor.BF16, tensor.F16:
		out := make([]byte, 2*len(vals))
		for i, v := range vals {
			h := tensor.F32ToBF16(v)
			if dt == tensor.F16 {
				h = tensor.F32ToF16(v)
			}
			binary.LittleEndian.PutUint16(out[2*i:], h)
		}
		return out, nil
	}
	rb, err := dt.RowBytes(cols)
	if err != nil {
		return nil, err
	}
	out := make([]byte, rows*rb)
	per := max(1, (rows+threads-1)/threads)
	var wg sync.WaitGroup
	errs := make([]error, threads)
	for k := range threads {
		lo, hi := k*per, min(rows, (k+1)*per)
		if lo >= hi {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			q, err := tensor.QuantizeRows(dt, vals[lo*cols:hi*cols], hi-lo, cols)
			if err != nil {
				errs[k] = err
				return
			}
			copy(out[lo*rb:], q)
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}
