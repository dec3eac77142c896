package modelinit

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// RopeScaling is the rope_scaling entry of config.json; the zero value
// writes null.
type RopeScaling struct {
	// Type is "linear", "llama3" or (phi3) "longrope".
	Type                          string
	Factor                        float64
	LowFreqFactor                 float64
	HighFreqFactor                float64
	OriginalMaxPositionEmbeddings int
	// ShortFactor and LongFactor are longrope's, one per rotary frequency
	// (Factor is left for max/original to give).
	ShortFactor, LongFactor []float64
}

// Spec is the architecture and storage of a model to write.
type Spec struct {
	// ModelType is "llama" (default), "mistral", "mixtral", "qwen2",
	// "qwen3", "qwen3_moe", "gemma3_text", "smollm3" or "phi3". qwen2 gets q/k/v biases;
	// qwen3, qwen3_moe and gemma3_text get per-head q/k norms; every
	// mixtral layer is sparse; gemma3_text gets Gemma 3's sandwich norms
	// (weights around 0: the norm scales by 1 + weight), GELU and
	// interleaved local and global layers (Gemma); smollm3 gets layers
	// without RoPE (NoRopeInterval); phi3 gets fused qkv_proj and
	// gate_up_proj and RoPE on PartialRotary of each head.
	ModelType    string
	Hidden       int
	Layers       int
	Heads        int
	KVHeads      int
	HeadDim      int // 0 = Hidden/Heads, omitted from config.json
	Intermediate int
	Vocab        int
	MaxPositions int
	RMSNormEps   float64
	RopeTheta    float64
	RopeScaling  RopeScaling
	Tied         bool
	// AttentionBias gives a llama, qwen3, qwen3_moe or smollm3 model q/k/v/o
	// biases.
	AttentionBias bool
	// MoE is the mixture-of-experts part of a qwen3_moe or mixtral model
	// (ignored for the other types; a mixtral reads only Experts and TopK,
	// its experts are Intermediate wide).
	MoE      MoE
	BOS, EOS int32
	// SlidingWindow, if positive, is the attention window of every layer
	// (mistral, mixtral; qwen2, qwen3 and qwen3_moe with
	// use_sliding_window and, for qwen2 and qwen3, max_window_layers 0).
	SlidingWindow int
	// Gemma is the Gemma 3 part of a gemma3_text model.
	Gemma Gemma
	// NoRopeInterval makes every NoRopeInterval-th layer of a smollm3
	// model one without RoPE (config.json's no_rope_layer_interval; 0
	// means 4, SmolLM3's). A smollm3 SlidingWindow windows those layers
	// (use_sliding_window).
	NoRopeInterval int
	// PartialRotary is a phi3 model's partial_rotary_factor (0 means 1).
	PartialRotary float64
	// DType of every tensor: "bf16", "f16" or "f32".
	DType string
	// Std is the scale of the random weights (uniform with this standard
	// deviation); 0 means 0.02, the usual initializer range.
	Std float64
	// NormJitter, if non-zero, draws norm weights from 1 ± NormJitter
	// instead of exactly 1 (tests use it so a misapplied norm shows).
	NormJitter float64
}

// Gemma describes what a gemma3_text model adds: every Pattern-th layer
// has full attention, the others a window of Spec.SlidingWindow and the
// RoPE base LocalRopeTheta; the attention scale is QueryScalar^-½.
type Gemma struct {
	Pattern        int
	LocalRopeTheta float64
	QueryScalar    float64
}

// MoE describes the sparse layers of a qwen3_moe model: config.json's
// num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob,
// decoder_sparse_step and mlp_only_layers.
type MoE struct {
	Experts      int
	TopK         int
	Intermediate int
	NormTopK     bool
	// SparseStep 0 means 1 (every layer not in DenseLayers is sparse).
	SparseStep  int
	DenseLayers []int
}

func (e MoE) sparseStep() int {
	if e.SparseStep == 0 {
		return 1
	}
	return e.SparseStep
}

// sparse reports whether layer i is sparse, as transformers'
// Qwen3MoeDecoderLayer decides (every mixtral layer is).
func (s Spec) sparse(i int) bool {
	if s.ModelType == "mixtral" {
		return true
	}
	if s.ModelType != "qwen3_moe" {
		return false
	}
	return (i+1)%s.MoE.sparseStep() == 0 && !slices.Contains(s.MoE.DenseLayers, i)
}

func (s Spec) qkNorm() bool {
	return s.ModelType == "qwen3" || s.ModelType == "qwen3_moe" || s.ModelType == "gemma3_text"
}

func (s Spec) headDim() int {
	if s.HeadDim != 0 {
		return s.HeadDim
	}
	return s.Hidden / s.Heads
}

// Validate reports the first field that cannot make a model.
func (s Spec) Validate() error {
	switch s.ModelType {
	case "", "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma3_text", "smollm3", "phi3":
	default:
		return fmt.Errorf("modelinit: model type %q: expected llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma3_text, smollm3 or phi3", s.ModelType)
	}
	if s.PartialRotary < 0 || s.PartialRotary > 1 {
		return fmt.Errorf("modelinit: partial rotary factor %v: expected 0 (all) or a number in (0, 1]", s.PartialRotary)
	}
	if s.NoRopeInterval < 0 {
		return fmt.Errorf("modelinit: no-RoPE interval %d: expected 0 (SmolLM3's 4) or a positive interval", s.NoRopeInterval)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"hidden", s.Hidden}, {"layers", s.Layers}, {"heads", s.Heads}, {"kv heads", s.KVHeads}, {"head dim", s.headDim()}, {"intermediate", s.Intermediate}, {"vocab", s.Vocab}, {"max positions", s.MaxPositions}} {
		if f.v <= 0 {
			return fmt.Errorf("modelinit: %s must be positive, found %d", f.name, f.v)
		}
	}
	if s.Heads%s.KVHeads != 0 {
		return fmt.Errorf("modelinit: kv heads %d must divide heads %d", s.KVHeads, s.Heads)
	}
	if s.HeadDim == 0 && s.Hidden%s.Heads != 0 {
		return fmt.Errorf("modelinit: hidden %d is not a multiple of heads %d: set HeadDim", s.Hidden, s.Heads)
	}
	if s.headDim()%2 != 0 {
		return fmt.Errorf("modelinit: head dim %d must be even", s.headDim())
	}
	if _, err := dtypeOf(s.DType); err != nil {
		return err
	}
	if s.ModelType == "qwen3_moe" {
		e := s.MoE
		if e.Experts <= 0 || e.TopK <= 0 || e.Intermediate <= 0 || e.SparseStep < 0 {
			return fmt.Errorf("modelinit: qwen3_moe needs positive experts, top-k and expert width, found %d, %d and %d", e.Experts, e.TopK, e.Intermediate)
		}
		if e.TopK > e.Experts {
			return fmt.Errorf("modelinit: top-k %d is more than the %d experts", e.TopK, e.Experts)
		}
		for _, l := range e.DenseLayers {
			if l < 0 || l >= s.Layers {
				return fmt.Errorf("modelinit: dense layer %d is outside the %d layers", l, s.Layers)
			}
		}
	}
	if s.ModelType == "mixtral" {
		e := s.MoE
		if e.Experts <= 0 || e.TopK <= 0 || e.TopK > e.Experts {
			return fmt.Errorf("modelinit: mixtral needs positive experts and a top-k of at most that many, found %d and %d", e.Experts, e.TopK)
		}
	}
	if g := s.Gemma; s.ModelType == "gemma3_text" && (g.Pattern <= 0 || g.LocalRopeTheta <= 1 || g.QueryScalar <= 0 || s.SlidingWindow <= 0) {
		return fmt.Errorf("modelinit: gemma3_text needs a positive layer pattern, query scalar and sliding window and a local RoPE base above 1, found %+v and window %d", g, s.SlidingWindow)
	}
	if s.SlidingWindow < 0 || s.SlidingWindow > 0 && s.modelType() == "llama" {
		return fmt.Errorf("modelinit: sliding window %d: expected 0, or a positive window for a model type other than llama", s.SlidingWindow)
	}
	if s.BOS < 0 || int(s.BOS) >= s.Vocab || s.EOS < 0 || int(s.EOS) >= s.Vocab {
		return fmt.Errorf("modelinit: bos %d and eos %d must be token ids below vocab %d", s.BOS, s.EOS, s.Vocab)
	}
	return nil
}

// Shape names accepted by Shape.
const (
	ShapeTiny         = "tiny"
	ShapeSmolLM2135M  = "smollm2-135m"
	ShapeLlama1B      = "llama-1b"
	ShapeQwen3Tiny    = "qwen3-tiny"
	ShapeQwen3MoETiny = "qwen3-moe-tiny"
	ShapeQwen306B     = "qwen3-0.6b"
	ShapeQwen330BA3B  = "qwen3-30b-a3b"
	ShapeMixtralTiny  = "mixtral-tiny"
	ShapeGemma3Tiny   = "gemma3-tiny"
	ShapeGemma31B     = "gemma-3-1b"
	ShapeSmolLM3Tiny  = "smollm3-tiny"
	ShapePhi3Tiny     = "phi3-tiny"
	ShapeQwen3MoE7B   = "qwen3-moe-7b-a1b"
)

var shapes = map[string]Spec{
	// Test-sized; the vocabulary is set from the tokenizer fixture.
	ShapeTiny: {
		ModelType: "llama", Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16,
		Intermediate: 128, MaxPositions: 2048, RMSNormEps: 1e-5, RopeTheta: 10000, Tied: true,
	},
	// SmolLM2-135M.
	ShapeSmolLM2135M: {
		ModelType: "llama", Hidden: 576, Layers: 30, Heads: 9, KVHeads: 3, HeadDim: 64,
		Intermediate: 1536, Vocab: 49152, MaxPositions: 8192, RMSNormEps: 1e-5, RopeTheta: 100000, Tied: true,
		BOS: 1, EOS: 2,
	},
	// Llama-3.2-1B.
	ShapeLlama1B: {
		ModelType: "llama", Hidden: 2048, Layers: 16, Heads: 32, KVHeads: 8, HeadDim: 64,
		Intermediate: 8192, Vocab: 128256, MaxPositions: 131072, RMSNormEps: 1e-5, RopeTheta: 500000, Tied: true,
		BOS: 128000, EOS: 128001,
		RopeScaling: RopeScaling{Type: "llama3", Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192},
	},
	// Test-sized Qwen3: head_dim 24 is not hidden/heads (16).
	ShapeQwen3Tiny: {
		ModelType: "qwen3", Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 24,
		Intermediate: 128, MaxPositions: 2048, RMSNormEps: 1e-6, RopeTheta: 1000000, Tied: true,
	},
	// Test-sized Qwen3-MoE: 8 experts, top-2 normalised, layer 0 dense.
	ShapeQwen3MoETiny: {
		ModelType: "qwen3_moe", Hidden: 64, Layers: 3, Heads: 4, KVHeads: 2, HeadDim: 24,
		Intermediate: 128, MaxPositions: 2048, RMSNormEps: 1e-6, RopeTheta: 1000000,
		MoE: MoE{Experts: 8, TopK: 2, Intermediate: 32, NormTopK: true, SparseStep: 1, DenseLayers: []int{0}},
	},
	// Test-sized Mixtral: 4 experts, top-2, every layer sparse.
	ShapeMixtralTiny: {
		ModelType: "mixtral", Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16,
		Intermediate: 96, MaxPositions: 2048, RMSNormEps: 1e-5, RopeTheta: 1000000,
		MoE: MoE{Experts: 4, TopK: 2},
	},
	// Test-sized Gemma 3: layers 0, 1, 3, 4 local with a window of 19
	// (shorter than the test prompts, not a multiple of a block or an
	// attention chunk), layer 2 global; head_dim 24 is not hidden/heads.
	ShapeGemma3Tiny: {
		ModelType: "gemma3_text", Hidden: 64, Layers: 5, Heads: 4, KVHeads: 2, HeadDim: 24,
		Intermediate: 128, MaxPositions: 2048, RMSNormEps: 1e-6, RopeTheta: 1000000, Tied: true,
		SlidingWindow: 19, Gemma: Gemma{Pattern: 3, LocalRopeTheta: 10000, QueryScalar: 24},
	},
	// Gemma 3 1B (gemma-3-1b-pt/-it): 26 layers, every 6th global, window
	// 512.
	ShapeGemma31B: {
		ModelType: "gemma3_text", Hidden: 1152, Layers: 26, Heads: 4, KVHeads: 1, HeadDim: 256,
		Intermediate: 6912, Vocab: 262144, MaxPositions: 32768, RMSNormEps: 1e-6, RopeTheta: 1000000, Tied: true,
		BOS: 2, EOS: 1, SlidingWindow: 512, Gemma: Gemma{Pattern: 6, LocalRopeTheta: 10000, QueryScalar: 256},
	},
	// Test-sized SmolLM3: layers 1 and 3 without RoPE (every 2nd), each
	// with a window of 13 (shorter than the test prompts); untied head.
	ShapeSmolLM3Tiny: {
		ModelType: "smollm3", Hidden: 64, Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 16,
		Intermediate: 128, MaxPositions: 2048, RMSNormEps: 1e-6, RopeTheta: 2000000,
		NoRopeInterval: 2, SlidingWindow: 13,
	},
	// Test-sized Phi-4-mini: RoPE on 12 of 16 dimensions, longrope up to
	// 1024 positions (of 4096), tied head.
	ShapePhi3Tiny: {
		ModelType: "phi3", Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2,
		Intermediate: 128, MaxPositions: 4096, RMSNormEps: 1e-5, RopeTheta: 10000, Tied: true, PartialRotary: 0.75,
		RopeScaling: RopeScaling{Type: "longrope", OriginalMaxPositionEmbeddings: 1024,
			ShortFactor: []float64{1, 1.05, 1.2, 1.5, 2, 3}, LongFactor: []float64{1, 2, 4, 8, 16, 32}},
	},
	// Qwen3-0.6B.
	ShapeQwen306B: {
		ModelType: "qwen3", Hidden: 1024, Layers: 28, Heads: 16, KVHeads: 8, HeadDim: 128,
		Intermediate: 3072, Vocab: 151936, MaxPositions: 40960, RMSNormEps: 1e-6, RopeTheta: 1000000, Tied: true,
		BOS: 151643, EOS: 151645,
	},
	// OLMoE-1B-7B's dimensions as a Qwen3-MoE (per-head q/k norms rather
	// than OLMoE's whole-projection ones): 64 experts of width 1024, 8
	// active per token; 6.9B parameters, 1.3B active. A mixture of experts
	// that fits a small host at Q4_K_M (about 4 GB) for measurements.
	ShapeQwen3MoE7B: {
		ModelType: "qwen3_moe", Hidden: 2048, Layers: 16, Heads: 16, KVHeads: 16, HeadDim: 128,
		Intermediate: 1024, Vocab: 50304, MaxPositions: 4096, RMSNormEps: 1e-5, RopeTheta: 10000,
		BOS: 50279, EOS: 50279,
		MoE: MoE{Experts: 64, TopK: 8, Intermediate: 1024, NormTopK: false, SparseStep: 1},
	},
	// Qwen3-30B-A3B: 128 experts, 8 active per token.
	ShapeQwen330BA3B: {
		ModelType: "qwen3_moe", Hidden: 2048, Layers: 48, Heads: 32, KVHeads: 4, HeadDim: 128,
		Intermediate: 6144, Vocab: 151936, MaxPositions: 40960, RMSNormEps: 1e-6, RopeTheta: 1000000,
		BOS: 151643, EOS: 151645,
		MoE: MoE{Experts: 128, TopK: 8, Intermediate: 768, NormTopK: true, SparseStep: 1},
	},
}

// Shapes returns the names of the built-in shapes, sorted.
func Shapes() []string {
	names := make([]string, 0, len(shapes))
	for n := range shapes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Shape returns the Spec of a named shape with the given dtype. The tiny
// shape's Vocab, BOS and EOS are left for the tokenizer fixture to fill.
func Shape(name, dtype string) (Spec, error) {
	s, ok := shapes[name]
	if !ok {
		return Spec{}, fmt.Errorf("modelinit: unknown shape %q (known: %s)", name, strings.Join(Shapes(), ", "))
	}
	if _, err := dtypeOf(dtype); err != nil {
		return Spec{}, err
	}
	s.DType = dtype
	s.MoE.DenseLayers = slices.Clone(s.MoE.DenseLayers)
	s.RopeScaling.ShortFactor = slices.Clone(s.RopeScaling.ShortFactor)
	s.RopeScaling.LongFactor = slices.Clone(s.RopeScaling.LongFactor)
	return s, nil
}
