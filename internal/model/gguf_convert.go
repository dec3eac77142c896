package model

import (
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/tandem-serve/tandem/internal/gguf"
	"github.com/tandem-serve/tandem/internal/model/safetensors"
)

// ConvertToGGUF and its options: the encodings it writes, the checks of
// the checkpoint, and the loop that writes the metadata (gguf_metadata.go)
// and then each tensor of the plan (gguf_plan.go), read, permuted where
// llama.cpp's layout asks and encoded (gguf_encode.go).

// GGUFEncodings are the weight encodings ConvertToGGUF writes, by name.
//
//   - f32, f16, bf16: every matrix in that type.
//   - q8_0, q4_0, q5_0, q6_k: every matrix in that type, except that q4_0
//     and q5_0 put the output matrix (the embeddings when they are tied) in
//     Q6_K, as llama.cpp's quantizer does.
//   - q4_k_m, q5_k_m (llama.cpp's Q4_K_M and Q5_K_M mixes): Q4_K (Q5_K), with
//     Q6_K for the output matrix (or the tied embeddings) and for attn_v and
//     ffn_down in the layers i of n where i < n/8, i ≥ 7n/8 or (i − n/8) mod
//     3 = 2 (llama.cpp's use_more_bits), which is about half of them.
//
// Norm weights, biases and rope_freqs are always F32. A matrix whose rows
// cannot be cut into the chosen type's blocks falls back as llama.cpp's
// quantizer does: Q4_K to Q5_0, Q6_K to Q8_0, Q5_K to Q8_0 (llama.cpp picks
// Q5_1, which Tandem does not have), and a 32-weight type to F16.
var GGUFEncodings = []string{"f32", "f16", "bf16", "q8_0", "q4_0", "q5_0", "q6_k", "q4_k_m", "q5_k_m"}

// ggufFileTypes are llama.cpp's general.file_type values (llama_ftype).
var ggufFileTypes = map[string]uint32{"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "q5_0": 8, "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18, "bf16": 32}

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
