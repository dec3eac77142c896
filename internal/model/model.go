package model

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"math"
	"slices"

	"github.com/tandem-serve/tandem/internal/gguf"
	"github.com/tandem-serve/tandem/internal/hugemem"
	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/model/safetensors"
	"github.com/tandem-serve/tandem/internal/tensor"
)

type layer struct {
	attnNorm, ffnNorm   []float32
	qkv                 linearGroup // q, k, v
	qBias, kBias, vBias []float32   // nil without biases
	qNorm, kNorm        []float32   // per-head q/k RMSNorm weights (HeadDim), nil without
	o                   tensor.Mat
	oBias               []float32
	// A dense layer has gateUp and down; a sparse one has moe instead.
	gateUp linearGroup // gate, up
	down   tensor.Mat
	moe    *moeLayer
	// window is the layer's attention window (0: full attention).
	window int
	// Gemma 3 only: the norms of the attention output and of the
	// feed-forward output (nil otherwise; ffnNorm is then the norm before
	// the feed-forward block), and whether the layer's RoPE is the local
	// one (a sliding-window layer).
	postAttnNorm, postFFNorm []float32
	localRope                bool
	// noRope: the layer applies no rotary embedding (SmolLM3's NoPE
	// layers).
	noRope bool
}

// Model is a loaded Llama-family decoder (llama, mistral, mixtral, qwen2,
// qwen3, qwen3_moe, gemma3_text, smollm3, phi3) whose
// weights alias read-only memory holding a safetensors checkpoint or a GGUF
// file.
//
// Forward must be called from one goroutine at a time (it reuses scratch
// buffers); the accessors are safe for concurrent use.
type Model struct {
	cfg       Config
	gen       GenerationConfig
	pool      *tensor.Pool
	src       weightSource
	embed     tensor.Mat
	lmHead    tensor.Mat // aliases embed when tied
	finalNorm []float32
	layers    []layer
	invFreq   []float64 // rotary inverse frequencies (with scaling), RotaryDims/2
	ropeScale float64   // cos and sin are multiplied by it (see ropeScale)
	// invFreqLocal are those of Gemma 3's sliding-window layers (nil
	// otherwise).
	invFreqLocal []float64

	numParams   int64
	weightBytes int64
	dtype       tensor.DType
	fingerprint string
	// panelMem holds the quantized matrices stored as panels (packPanels),
	// nil if none.
	panelMem []byte
	closed   bool
	// attnSeg is the attention's key segment length when a test sets one
	// shorter than attnSegKeys (see segKeys); 0 otherwise.
	attnSeg int

	s scratch
}

// Load opens the Hugging Face checkpoint in dir (config.json,
// generation_config.json if present, model.safetensors or shards) and binds
// its weights. dir may instead be a GGUF file (see LoadGGUF). Kernels run on
// pool.
func Load(dir string, pool *tensor.Pool) (*Model, error) { return LoadWith(dir, pool, LoadOptions{}) }

// LoadOptions are Load's options.
type LoadOptions struct {
	// Progress, when set, is told the bytes of weights read so far and in
	// all: once before the first read and after each piece, one call at a
	// time (from the reading goroutines).
	Progress func(read, total int64)
}

// LoadWith is Load with options.
func LoadWith(dir string, pool *tensor.Pool, opts LoadOptions) (*Model, error) {
	if pool == nil {
		return nil, errors.New("model: Load needs a tensor.Pool, got nil")
	}
	if gguf.IsFile(dir) {
		return loadGGUF(dir, pool, opts.Progress)
	}
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	gen, err := LoadGenerationConfig(dir)
	if err != nil {
		return nil, err
	}
	set, err := safetensors.OpenDirProgress(dir, opts.Progress)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	m := &Model{cfg: *cfg, gen: *gen, pool: pool, src: safetensorsSource{set}}
	if err := m.bind(); err != nil {
		set.Close()
		return nil, err
	}
	m.setRope()
	m.fingerprint = m.computeFingerprint()
	return m, nil
}

// setRope computes the rotary inverse frequencies: one table, or for Gemma
// 3 a second one (its local base, no scaling) for the sliding-window
// layers.
func (m *Model) setRope() {
	m.invFreq = ropeInvFreq(&m.cfg)
	m.ropeScale = ropeScale(&m.cfg)
	if m.cfg.Gemma.LocalRopeTheta > 0 {
		local := m.cfg
		local.RopeTheta, local.RopeScaling = m.cfg.Gemma.LocalRopeTheta, RopeScaling{}
		m.invFreqLocal = ropeInvFreq(&local)
	}
}

func (m *Model) bind() error {
	c := &m.cfg
	b := &binder{src: m.src, byType: map[tensor.DType]int64{}, mapped: map[uintptr]bool{}}
	var err error
	if m.embed, err = b.matrix("model.embed_tokens.weight", c.Vocab, c.Hidden); err != nil {
		return err
	}
	if c.TieWordEmbeddings {
		m.lmHead = m.embed
	} else if m.lmHead, err = b.matrix("lm_head.weight", c.Vocab, c.Hidden); err != nil {
		return fmt.Errorf("%w (config.json has tie_word_embeddings false)", err)
	}
	if m.finalNorm, err = b.vector("model.norm.weight", c.Hidden); err != nil {
		return err
	}
	m.gemmaNorm(m.finalNorm)
	m.layers = make([]layer, c.Layers)
	for i := range m.layers {
		if err := m.bindLayer(b, i); err != nil {
			return err
		}
	}
	m.numParams, m.weightBytes = b.params, b.bytes
	var best int64 = -1
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16, tensor.Q8_0, tensor.Q4_0, tensor.Q4_K, tensor.Q5_K, tensor.Q6_K} {
		if b.byType[dt] > best {
			m.dtype, best = dt, b.byType[dt]
		}
	}
	return nil
}

func (m *Model) bindLayer(b *binder, i int) error {
	c := &m.cfg
	l := &m.layers[i]
	l.window = c.LayerWindow(i)
	l.noRope = !c.LayerRope(i)
	p := fmt.Sprintf("model.layers.%d.", i)
	var err error
	mat := func(name string, rows, cols int) tensor.Mat {
		if err != nil {
			return tensor.Mat{}
		}
		var w tensor.Mat
		w, err = b.matrix(p+name, rows, cols)
		return w
	}
	vec := func(name string, n int) []float32 {
		if err != nil {
			return nil
		}
		var v []float32
		v, err = b.vector(p+name, n)
		return v
	}
	l.attnNorm = vec("input_layernorm.weight", c.Hidden)
	if c.ModelType == "gemma3_text" {
		l.postAttnNorm = vec("post_attention_layernorm.weight", c.Hidden)
		l.ffnNorm = vec("pre_feedforward_layernorm.weight", c.Hidden)
		l.postFFNorm = vec("post_feedforward_layernorm.weight", c.Hidden)
		l.localRope = l.window > 0
	} else {
		l.ffnNorm = vec("post_attention_layernorm.weight", c.Hidden)
	}
	var q, k, v, qkv tensor.Mat
	if c.ModelType == "phi3" {
		qkv = mat("self_attn.qkv_proj.weight", c.QDim()+2*c.KVDim(), c.Hidden)
	} else {
		q = mat("self_attn.q_proj.weight", c.QDim(), c.Hidden)
		k = mat("self_attn.k_proj.weight", c.KVDim(), c.Hidden)
		v = mat("self_attn.v_proj.weight", c.KVDim(), c.Hidden)
	}
	l.o = mat("self_attn.o_proj.weight", c.Hidden, c.QDim())
	if c.QKVBias {
		l.qBias = vec("self_attn.q_proj.bias", c.QDim())
		l.kBias = vec("self_attn.k_proj.bias", c.KVDim())
		l.vBias = vec("self_attn.v_proj.bias", c.KVDim())
	}
	if c.OBias {
		l.oBias = vec("self_attn.o_proj.bias", c.Hidden)
	}
	if c.QKNorm {
		l.qNorm = vec("self_attn.q_norm.weight", c.HeadDim)
		l.kNorm = vec("self_attn.k_norm.weight", c.HeadDim)
	}
	if err != nil {
		return err
	}
	for _, w := range [][]float32{l.attnNorm, l.ffnNorm, l.postAttnNorm, l.postFFNorm, l.qNorm, l.kNorm} {
		m.gemmaNorm(w)
	}
	if c.ModelType == "phi3" {
		l.qkv = fusedGroup(qkv, c.QDim(), c.KVDim(), c.KVDim())
		gateUp := mat("mlp.gate_up_proj.weight", 2*c.Intermediate, c.Hidden)
		l.down = mat("mlp.down_proj.weight", c.Hidden, c.Intermediate)
		l.gateUp = fusedGroup(gateUp, c.Intermediate, c.Intermediate)
		return err
	}
	l.qkv = b.newLinearGroup(q, k, v)
	if c.SparseLayer(i) {
		l.moe, err = bindMoE(b, c, p)
		return err
	}
	gate := mat("mlp.gate_proj.weight", c.Intermediate, c.Hidden)
	up := mat("mlp.up_proj.weight", c.Intermediate, c.Hidden)
	l.down = mat("mlp.down_proj.weight", c.Hidden, c.Intermediate)
	if err != nil {
		return err
	}
	l.gateUp = b.newLinearGroup(gate, up)
	return nil
}

// gemmaNorm turns a Gemma RMSNorm weight w into the factor it scales by,
// 1 + w (in f32, as transformers' Gemma3RMSNorm computes it), so that the
// Llama family's RMSNorm applies it; other models' weights are left as
// they are, and so are a GGUF file's (llama.cpp's gemma3 files store
// 1 + w, which ConvertToGGUF computes the same way).
func (m *Model) gemmaNorm(w []float32) {
	if m.cfg.ModelType != "gemma3_text" || m.src.format() == "gguf" {
		return
	}
	for i, v := range w {
		w[i] = 1 + v
	}
}

// Config returns a copy of the model's configuration.
func (m *Model) Config() Config {
	c := m.cfg
	c.BOS = slices.Clone(c.BOS)
	c.EOS = slices.Clone(c.EOS)
	c.MoE.DenseLayers = slices.Clone(c.MoE.DenseLayers)
	c.FullLayers = slices.Clone(c.FullLayers)
	c.NoRopeLayers = slices.Clone(c.NoRopeLayers)
	c.RopeScaling.ShortFactor = slices.Clone(c.RopeScaling.ShortFactor)
	c.RopeScaling.LongFactor = slices.Clone(c.RopeScaling.LongFactor)
	return c
}

// GenerationConfig returns a copy of the defaults of generation_config.json
// (all nil when the file is absent).
func (m *Model) GenerationConfig() GenerationConfig {
	g := m.gen
	g.Temperature = clonePtr(g.Temperature)
	g.TopP = clonePtr(g.TopP)
	g.TopK = clonePtr(g.TopK)
	g.MinP = clonePtr(g.MinP)
	g.RepetitionPenalty = clonePtr(g.RepetitionPenalty)
	g.MaxNewTokens = clonePtr(g.MaxNewTokens)
	g.DoSample = clonePtr(g.DoSample)
	g.EOS = slices.Clone(g.EOS)
	return g
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// KVLayout returns the layout of a paged KV pool with blockSize slots per
// block and the model's default KV element type (KVDType).
func (m *Model) KVLayout(blockSize int) kvlayout.Layout { return m.KVLayoutOf(blockSize, m.KVDType()) }

// KVLayoutOf is KVLayout with the element type dt (F32 or BF16).
func (m *Model) KVLayoutOf(blockSize int, dt kvlayout.ElemType) kvlayout.Layout {
	return kvlayout.Layout{BlockSize: blockSize, Layers: m.cfg.Layers, KVHeads: m.cfg.KVHeads, HeadDim: m.cfg.HeadDim, DType: dt}
}

// KVGroups returns the KV-cache groups of the model's layers: with hybrid,
// grouped by attention type (kvlayout.Grouped: a sliding-window group keeps
// only its window's blocks); without, one group of every layer
// (kvlayout.Single). Forward tells them apart by the layout's layers per
// block: KVLayoutOf's or GroupedKVLayout's.
func (m *Model) KVGroups(hybrid bool) []kvlayout.Group {
	windows := make([]int, m.cfg.Layers)
	for i := range windows {
		windows[i] = m.cfg.LayerWindow(i)
	}
	if hybrid {
		return kvlayout.Grouped(windows)
	}
	return kvlayout.Single(windows)
}

// GroupedKVLayout is KVLayoutOf for a pool of hybrid KV-cache groups
// (KVGroups(true)): a block holds the layers of one group.
func (m *Model) GroupedKVLayout(blockSize int, dt kvlayout.ElemType) kvlayout.Layout {
	l := m.KVLayoutOf(blockSize, dt)
	l.Layers = kvlayout.PageLayers(m.KVGroups(true))
	return l
}

// KVDType is the model's default KV cache element type, as vLLM's
// --kv-cache-dtype auto picks it on a CPU: bf16 for a bf16 model (half the
// memory and bandwidth of f32), for an f16 one (vLLM's CPU backend runs
// float16 models in bfloat16; Tandem has bf16 attention kernels and no f16
// ones, and f32 K and V made qwen3-0.6b's prefill of 2,048 tokens 0.90×
// llama.cpp's where bf16 makes it 1.44×) and for a quantized one (whose
// weights were rounded far more than bf16 rounds K and V); f32 for an f32
// model.
func (m *Model) KVDType() kvlayout.ElemType {
	if m.dtype == tensor.BF16 || m.dtype == tensor.F16 || m.dtype.Quantized() {
		return kvlayout.BF16
	}
	return kvlayout.F32
}

// NumParams returns the number of parameters (tied embeddings counted once).
func (m *Model) NumParams() int64 { return m.numParams }

// WeightBytes returns the bytes of weights as stored (and mapped).
func (m *Model) WeightBytes() int64 { return m.weightBytes }

// DType returns the dtype most weight bytes are stored in (matrices only).
func (m *Model) DType() tensor.DType { return m.dtype }

// MaxModelLen returns the number of positions a sequence may use.
func (m *Model) MaxModelLen() int { return m.cfg.MaxModelLen() }

// VocabSize returns the number of logits per token.
func (m *Model) VocabSize() int { return m.cfg.Vocab }

// Fingerprint returns a stable identity of the architecture and weights: a
// SHA-256 over the essential configuration, every tensor's name, dtype and
// shape, and a sample of each tensor's bytes (start, middle, end); for a
// GGUF file, also the format (its tensors are named, typed and laid out
// differently from the checkpoint they came from). Two
// engines that agree on it compute the same KV for the same tokens, up to
// the rounding of their CPU kernel sets (tensor.ISA), which it does not
// name: prefix-cache hashing and the prefill/decode handshake rely on it,
// and engines whose sets differ still exchange KV — valid, but not
// bit-identical to a colocated run (the handshake's kvxfer.Info.Kernels
// says so in the decode's log).
func (m *Model) Fingerprint() string { return m.fingerprint }

// fingerprintSample is the number of bytes hashed at each of the start,
// middle and end of every tensor: enough to tell different checkpoints
// apart, cheap enough (a few pages per tensor) to compute at every load.
const fingerprintSample = 256

func (m *Model) computeFingerprint() string {
	h := sha256.New()
	c := &m.cfg
	if f := m.src.format(); f != "" {
		fmt.Fprintf(h, "tandem-model-v1\x00format=%s\x00", f)
	}
	fmt.Fprintf(h, "tandem-model-v1\x00type=%s hidden=%d layers=%d heads=%d kv=%d head_dim=%d ffn=%d vocab=%d maxpos=%d eps=%x theta=%x rope=%s/%x/%x/%x/%d tied=%t qkvbias=%t obias=%t window=%d\x00",
		c.ModelType, c.Hidden, c.Layers, c.Heads, c.KVHeads, c.HeadDim, c.Intermediate, c.Vocab, c.MaxPositions,
		math.Float64bits(c.RMSNormEps), math.Float64bits(c.RopeTheta), c.RopeScaling.Type,
		math.Float64bits(c.RopeScaling.Factor), math.Float64bits(c.RopeScaling.LowFreqFactor),
		math.Float64bits(c.RopeScaling.HighFreqFactor), c.RopeScaling.OriginalMaxPositionEmbeddings,
		c.TieWordEmbeddings, c.QKVBias, c.OBias, c.SlidingWindow)
	if c.QKNorm || c.MoE.Experts > 0 {
		// Only for the architectures that have them, so that the
		// fingerprints of the others stay what they were.
		e := &c.MoE
		fmt.Fprintf(h, "qknorm=%t experts=%d topk=%d normtopk=%t moeffn=%d step=%d dense=%v\x00",
			c.QKNorm, e.Experts, e.TopK, e.NormTopK, e.Intermediate, e.SparseStep, e.DenseLayers)
	}
	if g := c.Gemma; g != (GemmaConfig{}) {
		fmt.Fprintf(h, "gemma local_theta=%x query_scalar=%x softcap=%x\x00",
			math.Float64bits(g.LocalRopeTheta), math.Float64bits(g.QueryScalar), math.Float64bits(g.FinalLogitSoftcap))
	}
	if c.SlidingWindow > 0 {
		// Which layers the window applies to (only for windowed models,
		// so that the fingerprints of the others stay what they were).
		fmt.Fprintf(h, "full_layers=%v\x00", c.FullLayers)
	}
	if len(c.NoRopeLayers) > 0 {
		fmt.Fprintf(h, "no_rope_layers=%v\x00", c.NoRopeLayers)
	}
	if c.RotaryDim > 0 || c.RopeScaling.Type == "longrope" {
		fmt.Fprintf(h, "rotary_dim=%d attention_factor=%x short_factor=%v\x00", c.RotaryDim,
			math.Float64bits(c.RopeScaling.AttentionFactor), c.RopeScaling.ShortFactor)
	}
	m.src.each(func(name string, w weight) {
		fmt.Fprintf(h, "%s\x00%s\x00%v\x00", name, w.typeName, w.shape)
		hashSample(h, w.data)
	})
	return hex.EncodeToString(h.Sum(nil))
}

func hashSample(h hash.Hash, d []byte) {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(d)))
	h.Write(n[:])
	if len(d) <= 3*fingerprintSample {
		h.Write(d)
		return
	}
	mid := len(d)/2 - fingerprintSample/2
	h.Write(d[:fingerprintSample])
	h.Write(d[mid : mid+fingerprintSample])
	h.Write(d[len(d)-fingerprintSample:])
}

// WeightPages returns the bytes of memory resident for the weights (the
// loaded file, less what packPanels moved out, and the panels) and how many
// of them the kernel holds in transparent huge pages (see package
// hugemem); ok is false where they cannot be read (not Linux) or the model
// is closed.
func (m *Model) WeightPages() (bytes, huge int64, ok bool) {
	if m.src == nil || m.closed {
		return 0, 0, false
	}
	ok = true
	mems := m.src.memory()
	if m.panelMem != nil {
		mems = append(mems, m.panelMem)
	}
	for _, mem := range mems {
		r, h, got := hugemem.Resident(mem)
		bytes, huge = bytes+r, huge+h
		ok = ok && got && cap(mem) > 0
	}
	return bytes, huge, ok
}

// PanelMemory returns the bytes of the matrices stored as the quantized
// kernels' panels at load (every quantized type, on CPUs with AVX512-VNNI;
// see packPanels), 0 if none.
func (m *Model) PanelMemory() int64 { return int64(len(m.panelMem)) }

// Close unmaps the weights. The model must not be used afterwards; Forward
// returns an error.
func (m *Model) Close() error {
	if m.closed {
		return nil
	}
	m.closed = true
	m.layers = nil
	m.embed, m.lmHead = tensor.Mat{}, tensor.Mat{}
	err := m.src.close()
	if m.panelMem != nil {
		err = errors.Join(err, hugemem.Unmap(m.panelMem))
		m.panelMem = nil
	}
	if err != nil {
		return fmt.Errorf("model: %w", err)
	}
	return nil
}

// Pool returns the worker pool the model computes on, for callers that want
// to run their own per-step parallel work (such as sampling) on the same
// threads. Like Forward, use it from one goroutine at a time.
func (m *Model) Pool() *tensor.Pool { return m.pool }
