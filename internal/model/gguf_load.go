package model

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"sync"

	"github.com/tandem-serve/tandem/internal/gguf"
	"github.com/tandem-serve/tandem/internal/hugemem"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// LoadGGUF loads the GGUF file at path: architecture llama (which llama.cpp
// also uses for Mistral and Mixtral), qwen2, qwen3, qwen3moe (whose stacked
// ffn_*_exps tensors are bound one expert at a time, as slices), gemma3,
// smollm3 or phi3,
// hyperparameters from the {arch}.* keys, tensors of the types package gguf
// supports. Quantized matrices stay
// quantized in memory; norms and biases are widened to f32. The q and k
// projections of llama and smollm3 files, which llama.cpp's converter permutes for its
// rotary layout, are permuted back to Hugging Face's, so the model computes
// exactly what the checkpoint it came from computes. A rope_freqs tensor
// (Llama 3 scaling) divides the rotary frequencies. Without output.weight
// the embeddings are tied.
//
// Like safetensors checkpoints, the tensors are read into read-only
// anonymous memory, not mapped from the file (see safetensors.Open); they
// are read by several threads at once, and laid out so that q, k and v, and
// gate and up, are adjacent and run as one matmul whatever order the file
// has them in.
func LoadGGUF(path string, pool *tensor.Pool) (*Model, error) { return loadGGUF(path, pool, nil) }

// loadGGUF is LoadGGUF telling progress (when set) the bytes of tensors read
// (LoadOptions.Progress).
func loadGGUF(path string, pool *tensor.Pool, progress func(read, total int64)) (*Model, error) {
	if pool == nil {
		return nil, errors.New("model: LoadGGUF needs a tensor.Pool, got nil")
	}
	f, err := gguf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	defer f.Close()
	cfg, gen, err := ggufConfig(f)
	if err != nil {
		return nil, err
	}
	src, err := loadGGUFTensors(f, cfg, progress)
	if err != nil {
		return nil, err
	}
	m := &Model{cfg: *cfg, gen: *gen, pool: pool, src: src}
	if err := m.bind(); err != nil {
		src.close()
		return nil, err
	}
	m.setRope()
	if cfg.RopeScaling.Type == "freqs" {
		if err := src.applyRopeFreqs(m.invFreq); err != nil {
			src.close()
			return nil, err
		}
	}
	m.fingerprint = m.computeFingerprint()
	if err := m.packPanels(); err != nil {
		m.Close()
		return nil, fmt.Errorf("model: %s: %w", path, err)
	}
	return m, nil
}

// ggufSource is a weightSource over a GGUF file's tensors, copied into one
// read-only anonymous mapping.
type ggufSource struct {
	path string
	// modelType picks the tensor names (see ggufName).
	modelType string
	mem       []byte
	tensors   map[string]weight // by GGUF name
}

func (s *ggufSource) lookup(hf string) (weight, bool) {
	if name, e, ok := ggufExpert(hf); ok {
		return s.expert(name, e)
	}
	name, ok := ggufName(hf, s.modelType)
	if !ok {
		return weight{}, false
	}
	w, ok := s.tensors[name]
	return w, ok
}

// expert returns expert e's matrix of the stacked [experts, rows, cols]
// tensor name: a slice of its bytes (every expert's rows are contiguous,
// whatever the type).
func (s *ggufSource) expert(name string, e int) (weight, bool) {
	w, ok := s.tensors[name]
	if !ok || len(w.shape) != 3 || e >= w.shape[0] || len(w.data)%w.shape[0] != 0 {
		return weight{}, false
	}
	per := len(w.data) / w.shape[0]
	w.shape = w.shape[1:]
	w.data = w.data[e*per : (e+1)*per : (e+1)*per]
	return w, true
}

func (s *ggufSource) describe(hf string) string {
	if name, e, ok := ggufExpert(hf); ok {
		return fmt.Sprintf("%q expert %d (Hugging Face %s)", name, e, hf)
	}
	if name, ok := ggufName(hf, s.modelType); ok {
		return fmt.Sprintf("%q (Hugging Face %s)", name, hf)
	}
	return fmt.Sprintf("%q", hf)
}

func (s *ggufSource) each(fn func(string, weight)) {
	names := make([]string, 0, len(s.tensors))
	for n := range s.tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fn(n, s.tensors[n])
	}
}

func (s *ggufSource) format() string { return "gguf" }

func (s *ggufSource) memory() [][]byte { return [][]byte{s.mem} }

func (s *ggufSource) close() error {
	if s.mem == nil {
		return nil
	}
	err := hugemem.Unmap(s.mem)
	s.mem, s.tensors = nil, nil
	if err != nil {
		return fmt.Errorf("model: %s: %w", s.path, err)
	}
	return nil
}

// applyRopeFreqs divides the rotary frequencies by the rope_freqs factors.
func (s *ggufSource) applyRopeFreqs(inv []float64) error {
	w := s.tensors[ggufRopeFreqs]
	if w.dtype != tensor.F32 || !slices.Equal(w.shape, []int{len(inv)}) {
		return fmt.Errorf("model: %s: tensor %s: expected F32 [%d], found %s %v", s.path, ggufRopeFreqs, len(inv), w.typeName, w.shape)
	}
	for i := range inv {
		fac := f32At(w.data, i)
		if !(fac > 0) {
			return fmt.Errorf("model: %s: tensor %s: factor %d is %v, expected a positive number", s.path, ggufRopeFreqs, i, fac)
		}
		inv[i] /= float64(fac)
	}
	return nil
}

// ggufLayerParts are the per-layer tensors, in the order they are laid out;
// the first two runs of names are laid out back to back when their types
// and widths agree (so that they fuse, see linearGroup).
var ggufLayerParts = [][]string{
	{"attn_q.weight", "attn_k.weight", "attn_v.weight"},
	{"ffn_gate.weight", "ffn_up.weight"},
	{"attn_norm.weight"}, {"attn_output.weight"}, {"ffn_norm.weight"}, {"ffn_down.weight"},
	{"attn_q.bias"}, {"attn_k.bias"}, {"attn_v.bias"}, {"attn_output.bias"},
}

// ggufQKNormParts are the per-layer q/k norms of qwen3 and qwen3moe;
// ggufMoEParts the router and stacked experts of qwen3moe.
var (
	ggufQKNormParts = [][]string{{"attn_q_norm.weight"}, {"attn_k_norm.weight"}}
	ggufGemmaParts  = [][]string{{"post_attention_norm.weight"}, {"post_ffw_norm.weight"}}
	ggufMoEParts    = [][]string{{"ffn_gate_inp.weight"}, {"ffn_gate_exps.weight"}, {"ffn_up_exps.weight"}, {"ffn_down_exps.weight"}}
)

// ggufPhi3Parts are the per-layer tensors of phi3, whose q, k and v, and
// gate and up, are fused in the file.
var ggufPhi3Parts = [][]string{
	{"attn_qkv.weight"}, {"ffn_up.weight"},
	{"attn_norm.weight"}, {"attn_output.weight"}, {"ffn_norm.weight"}, {"ffn_down.weight"},
}

// layerParts returns the per-layer tensors of c's architecture.
func layerParts(c *Config) [][]string {
	if c.ModelType == "phi3" {
		return ggufPhi3Parts
	}
	parts := ggufLayerParts
	if c.QKNorm {
		parts = append(slices.Clone(parts), ggufQKNormParts...)
	}
	if c.MoE.Experts > 0 {
		parts = append(slices.Clone(parts), ggufMoEParts...)
	}
	if c.ModelType == "gemma3_text" {
		parts = append(slices.Clone(parts), ggufGemmaParts...)
	}
	return parts
}

// ggufLoadReaders is how many threads read a GGUF file's tensors at once
// (0: GOMAXPROCS, at least 2 and at most 4); tests change it.
var ggufLoadReaders = 0

// ggufReadChunk is the most bytes one read call moves.
const ggufReadChunk = 8 << 20

// loadGGUFTensors checks that f holds only tensors of the architecture,
// lays them out in one anonymous mapping, reads them in parallel, undoes
// llama's q/k permutation and makes the mapping read-only.
func loadGGUFTensors(f *gguf.File, c *Config, progress func(read, total int64)) (*ggufSource, error) {
	var groups [][]*gguf.TensorInfo
	used := map[string]bool{}
	add := func(names ...string) {
		var g []*gguf.TensorInfo
		for _, n := range names {
			if t, ok := f.Tensor(n); ok {
				g = append(g, t)
				used[n] = true
			}
		}
		if len(g) == 0 {
			return
		}
		if !fusable(g) {
			for _, t := range g {
				groups = append(groups, []*gguf.TensorInfo{t})
			}
			return
		}
		groups = append(groups, g)
	}
	add(ggufEmbed)
	add(ggufNorm)
	add(ggufOutput)
	add(ggufRopeFreqs)
	if c.ModelType == "phi3" {
		add(ggufRopeShort)
		add(ggufRopeLong)
	}
	parts := layerParts(c)
	for i := range c.Layers {
		for _, part := range parts {
			names := make([]string, len(part))
			for k, p := range part {
				names[k] = fmt.Sprintf("blk.%d.%s", i, p)
			}
			add(names...)
		}
	}
	for i := range f.Tensors {
		if t := &f.Tensors[i]; !used[t.Name] {
			what := "is not part of the " + c.ModelType + " architecture as Tandem runs it"
			if n, part, ok := ggufLayer(t.Name); ok && n >= c.Layers {
				what = fmt.Sprintf("is beyond the %d layers of %s.block_count", c.Layers, c.ModelType)
			} else if ok && !slices.ContainsFunc(parts, func(p []string) bool { return slices.Contains(p, part) }) {
				what = "is a per-layer tensor the " + c.ModelType + " architecture does not have"
			}
			return nil, fmt.Errorf("model: %s: tensor %q %s", f.Path, t.Name, what)
		}
	}

	// Lay out: every group starts 64-byte aligned, its members back to back.
	var place []placed
	var size int64
	for _, g := range groups {
		size = (size + 63) &^ 63
		for _, t := range g {
			place = append(place, placed{t, size})
			size += t.Size
		}
	}
	// In huge pages where the kernel offers them (see package hugemem):
	// decode streams every weight once a token.
	mem, err := hugemem.Map(int(size))
	if err != nil {
		return nil, fmt.Errorf("model: allocate %d bytes for %s: %w", size, f.Path, err)
	}
	src := &ggufSource{path: f.Path, modelType: c.ModelType, mem: mem, tensors: make(map[string]weight, len(place))}
	fail := func(err error) (*ggufSource, error) {
		_ = hugemem.Unmap(mem)
		return nil, err
	}

	type job struct {
		dst []byte
		off int64 // in the data section
	}
	var jobs []job
	for _, p := range place {
		dst := mem[p.off : p.off+p.t.Size : p.off+p.t.Size]
		for o := int64(0); o < p.t.Size; o += ggufReadChunk {
			e := min(o+ggufReadChunk, p.t.Size)
			jobs = append(jobs, job{dst[o:e], p.t.Offset + o})
		}
		dt, ok := ggufDType(p.t.Type)
		if !ok {
			return fail(fmt.Errorf("model: %s: tensor %q has type %s, which Tandem cannot compute with", f.Path, p.t.Name, p.t.Type))
		}
		src.tensors[p.t.Name] = weight{dtype: dt, ok: true, typeName: p.t.Type.String(), shape: p.t.Shape(), data: dst, file: f.Path}
	}
	sort.Slice(jobs, func(i, j int) bool { return jobs[i].off < jobs[j].off })
	readers := ggufLoadReaders
	if readers <= 0 {
		readers = min(4, max(2, runtime.GOMAXPROCS(0)))
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		next   int
		first  error
		read   int64 // of toRead, for progress
		toRead int64
	)
	for _, p := range place {
		toRead += p.t.Size
	}
	if progress != nil {
		progress(0, toRead)
	}
	for range min(readers, len(jobs)) {
		wg.Go(func() {
			for {
				mu.Lock()
				if next >= len(jobs) || first != nil {
					mu.Unlock()
					return
				}
				j := jobs[next]
				next++
				mu.Unlock()
				err := f.ReadData(j.dst, j.off)
				mu.Lock()
				if first = cmpErr(first, err); err == nil && progress != nil {
					read += int64(len(j.dst))
					progress(read, toRead)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first != nil {
		return fail(fmt.Errorf("model: %s: %w", f.Path, first))
	}
	if c.ModelType == "llama" || c.ModelType == "mixtral" || c.ModelType == "smollm3" {
		if err := src.unpermuteQK(c); err != nil {
			return fail(err)
		}
	}
	if err := hugemem.Protect(mem); err != nil {
		return fail(fmt.Errorf("model: %s: %w", f.Path, err))
	}
	return src, nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// placed is a tensor and its offset in the loaded mapping.
type placed struct {
	t   *gguf.TensorInfo
	off int64
}

// fusable reports whether a group's tensors can be laid out as one matrix:
// all 2-D, of one type and width.
func fusable(g []*gguf.TensorInfo) bool {
	for _, t := range g {
		if len(t.Dims) != 2 || t.Type != g[0].Type || t.Dims[0] != g[0].Dims[0] {
			return false
		}
	}
	return true
}

// unpermuteQK undoes llama.cpp's q/k row permutation (see permuteRows) on
// every layer's q and k weights and biases.
func (s *ggufSource) unpermuteQK(c *Config) error {
	for i := range c.Layers {
		for _, p := range []struct {
			name  string
			heads int
		}{{"attn_q", c.Heads}, {"attn_k", c.KVHeads}} {
			for _, suffix := range []string{".weight", ".bias"} {
				name := fmt.Sprintf("blk.%d.%s%s", i, p.name, suffix)
				w, ok := s.tensors[name]
				if !ok {
					continue
				}
				rows := w.shape[0]
				if rows != p.heads*c.HeadDim {
					return fmt.Errorf("model: %s: tensor %q has %d rows, expected %d heads × %d", s.path, name, rows, p.heads, c.HeadDim)
				}
				rowBytes := len(w.data) / rows
				if len(w.shape) == 1 {
					_, rowBytes = w.dtype.BlockSize()
					if w.dtype.Quantized() {
						return fmt.Errorf("model: %s: tensor %q: a quantized bias cannot be permuted", s.path, name)
					}
				}
				if err := permuteRows(w.data, p.heads, c.HeadDim, rowBytes, true); err != nil {
					return fmt.Errorf("model: %s: tensor %q: %w", s.path, name, err)
				}
			}
		}
	}
	return nil
}
