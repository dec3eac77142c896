package model

import (
	"slices"
	"testing"

	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// A Q8_0, Q4_0, Q5_0, Q6_K, Q4_K_M or Q5_K_M model whose matrices are stored as panels computes the
// bits of the same model with ggml's rows, prefill and decode, and keeps
// its fingerprint.
func TestPanelsKeepTheModelsBits(t *testing.T) {
	probe := &tensor.Mat{DType: tensor.Q8_0, Rows: 16, Cols: 32, Q: make([]byte, 16*34)}
	for _, c := range []struct {
		enc    string
		dt     tensor.DType
		hidden int
		inter  int
	}{
		// Every width a multiple of the blocks and of 16 rows, so that
		// every quantized matrix, the tied embedding too, is stored as
		// panels.
		{"q8_0", tensor.Q8_0, 64, 96},
		{"q4_0", tensor.Q4_0, 128, 256},
		{"q5_0", tensor.Q5_0, 128, 256},
		{"q6_k", tensor.Q6_K, 256, 512},
		{"q4_k_m", tensor.Q4_K, 256, 512},
		{"q5_k_m", tensor.Q5_K, 256, 512},
	} {
		t.Run(c.enc, func(t *testing.T) {
			dir := writeTestModel(t, testSpec(func(s *modelinit.Spec) {
				s.DType, s.Tied, s.Hidden, s.Intermediate, s.Heads, s.HeadDim = "bf16", true, c.hidden, c.inter, 4, c.hidden/4
			}))
			path := convertGGUF(t, dir, c.enc)
			keepRows = true
			rows := loadTestModel(t, path, 2)
			keepRows = false
			panels := loadTestModel(t, path, 2)
			packed, ofType := 0, 0 // a Q4_0 model keeps its embedding in Q8_0
			panels.eachMat(func(w *tensor.Mat) {
				if w.Panels {
					packed++
					if w.DType == c.dt {
						ofType++
					}
				}
			})
			if tensor.PanelBytes(probe) == 0 {
				if packed != 0 {
					t.Fatalf("%d matrices stored as panels where no kernel reads them", packed)
				}
				t.Skip("this CPU's kernels do not read panels")
			}
			if ofType == 0 {
				t.Fatalf("no %s matrix was stored as panels", c.dt)
			}
			if rows.PanelMemory() != 0 || panels.PanelMemory() == 0 {
				t.Errorf("PanelMemory %d with rows, %d with panels", rows.PanelMemory(), panels.PanelMemory())
			}
			if e := panels.embed; c.dt == tensor.Q8_0 && (e.DType != tensor.Q8_0 || !e.Panels || !panels.lmHead.Panels || &e.Q[0] != &panels.lmHead.Q[0]) {
				t.Error("the tied embedding and lm_head are not one panel-stored matrix")
			}
			if rows.Fingerprint() != panels.Fingerprint() {
				t.Errorf("fingerprints differ: %s with rows, %s with panels", rows.Fingerprint(), panels.Fingerprint())
			}
			prompt := []int32{1, 5, 9, 23, 40, 7, 3, 60, 12, 2}
			if a, b := logitsOf(t, rows, prompt), logitsOf(t, panels, prompt); !slices.EqualFunc(a, b, slices.Equal) {
				t.Error("prefill logits differ between rows and panels")
			}
			if g, w := greedy(t, panels, prompt, 12), greedy(t, rows, prompt, 12); !slices.Equal(g, w) {
				t.Errorf("greedy decode with panels %v, with rows %v", g, w)
			}
			if total, _, ok := panels.WeightPages(); ok && total == 0 {
				t.Error("WeightPages counts no memory")
			}
		})
	}
}
