package model

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"testing"

	"github.com/tandem-serve/tandem/internal/hugemem"
	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/model/safetensors"
	"github.com/tandem-serve/tandem/internal/modelinit"
)

// sortWeights rewrites dir/model.safetensors with the tensor data in name
// order, as Hugging Face's save_file does: q_proj is no longer next to
// k_proj, so q/k/v cannot be fused.
func sortWeights(t *testing.T, dir string) {
	t.Helper()
	path := filepath.Join(dir, safetensors.SingleFile)
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	infos := append([]safetensors.Info(nil), f.Header().Tensors...)
	sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
	data := make([][]byte, len(infos))
	for i, info := range infos {
		tn, _ := f.Tensor(info.Name)
		data[i] = append([]byte(nil), tn.Data...)
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
	for _, d := range data {
		if _, err := w.Write(d); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestUnfusedLayoutMatchesReference(t *testing.T) {
	f32ActivationISA(t)
	spec := testSpec(func(s *modelinit.Spec) { s.ModelType = "qwen2"; s.DType = "bf16" })
	dir := writeTestModel(t, spec)
	sortWeights(t, dir)
	m := loadTestModel(t, dir, 2)
	l := m.layers[0]
	if l.qkv.fused {
		t.Fatal("q/k/v fused although k_proj, o_proj, q_proj, v_proj are stored in name order")
	}
	if !l.gateUp.fused {
		t.Error("gate_proj and up_proj are adjacent in name order but were not fused")
	}
	ref := newRefModel(t, dir)
	tokens := randomTokens(rand.New(rand.NewPCG(5, 6)), 9, spec.Vocab)
	want := ref.logits(t, tokens)
	layout := m.KVLayoutOf(4, kvlayout.F32)
	kv, blocks := contiguous(layout, len(tokens))
	out, err := m.Forward([]Seq{{Tokens: tokens, Blocks: blocks, Logits: allIndexes(len(tokens))}}, kv, layout)
	if err != nil {
		t.Fatal(err)
	}
	V := m.VocabSize()
	var maxAbs, maxDiff float64
	for p := range tokens {
		for j := range V {
			maxAbs = max(maxAbs, math.Abs(want[p][j]))
			maxDiff = max(maxDiff, math.Abs(float64(out[0][p*V+j])-want[p][j]))
		}
	}
	if maxDiff > 1e-4*maxAbs {
		t.Errorf("max |Δlogit| %g exceeds 1e-4 of max |logit| %g", maxDiff, maxAbs)
	}
}

func TestViewsCopyWhenMisaligned(t *testing.T) {
	buf := make([]byte, 4*5+3)
	for off := range 4 {
		b := buf[off : off+4*5]
		for i := range 5 {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(i)+0.5))
		}
		f := f32View(b, 5)
		for i, v := range f {
			if v != float32(i)+0.5 {
				t.Errorf("offset %d: f32View[%d] = %g", off, i, v)
			}
		}
		u := u16View(b, 10)
		for i, v := range u {
			if want := binary.LittleEndian.Uint16(b[2*i:]); v != want {
				t.Errorf("offset %d: u16View[%d] = %#x, want %#x", off, i, v, want)
			}
		}
	}
}

// TestWeightsLiveInHugemem: both loaders put the weights in hugemem's
// mappings, which WeightPages measures (in huge pages where the kernel
// gives them), and a closed model reports nothing.
func TestWeightsLiveInHugemem(t *testing.T) {
	dir := writeTestModel(t, testSpec(func(s *modelinit.Spec) { s.DType = "bf16" }))
	for name, path := range map[string]string{"safetensors": dir, "gguf": convertGGUF(t, dir, "q8_0")} {
		t.Run(name, func(t *testing.T) {
			m := loadTestModel(t, path, 1)
			bytes, huge, ok := m.WeightPages()
			if runtime.GOOS == "linux" && !ok {
				t.Fatal("WeightPages cannot say on Linux")
			}
			// Resident: the weights (the file's pages once read, less what
			// packPanels moved into its panels, and the panels).
			if runtime.GOOS == "linux" && (bytes < m.WeightBytes()/2 || bytes > 2*m.WeightBytes()+4*hugemem.Align) {
				t.Errorf("%d bytes resident for %d bytes of weights", bytes, m.WeightBytes())
			}
			if huge > bytes {
				t.Errorf("%d bytes in huge pages of %d resident", huge, bytes)
			}
			if mode := hugemem.Mode(); huge == 0 && (mode == "always" || mode == "madvise") {
				// A fragmented host may have no huge page to give.
				t.Logf("THP %s, yet none of the %d bytes is in huge pages", mode, bytes)
			}
			m.Close()
			if _, _, ok := m.WeightPages(); ok {
				t.Error("a closed model reports its weights' pages")
			}
		})
	}
}

// The default KV-cache element type follows the weights as vLLM's auto
// does on a CPU: f32 for an f32 model, bf16 for a bf16, f16 (vLLM's CPU
// backend runs float16 in bfloat16) or quantized one.
func TestKVDTypeFollowsTheWeights(t *testing.T) {
	for _, c := range []struct {
		dtype string
		gguf  string // an encoding to convert the model to, or ""
		want  kvlayout.ElemType
	}{{"f32", "", kvlayout.F32}, {"bf16", "", kvlayout.BF16}, {"f16", "", kvlayout.BF16}, {"bf16", "q8_0", kvlayout.BF16}} {
		dir := writeTestModel(t, testSpec(func(s *modelinit.Spec) {
			// Widths of whole Q8_0 blocks, so that no matrix falls back to f16.
			s.DType, s.Hidden, s.Intermediate, s.Heads, s.HeadDim = c.dtype, 64, 96, 4, 16
		}))
		path, stored := dir, c.dtype
		if c.gguf != "" {
			path, stored = convertGGUF(t, dir, c.gguf), c.gguf
		}
		m := loadTestModel(t, path, 1)
		if m.DType().String() != stored {
			t.Fatalf("%s model %q loaded as %s", c.dtype, c.gguf, m.DType())
		}
		if m.KVDType() != c.want {
			t.Errorf("%s model %q: KV %s, want %s", c.dtype, c.gguf, m.KVDType(), c.want)
		}
	}
}
