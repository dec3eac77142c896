package kvlayout

import (
	"strings"
	"testing"
)

func TestParseElemType(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    ElemType
		set     bool
		wantErr string
	}{
		{"", F32, false, ""},
		{"auto", F32, false, ""},
		{"AUTO", F32, false, ""},
		{"bfloat16", BF16, true, ""},
		{"bf16", BF16, true, ""},
		{"float32", F32, true, ""},
		{"f32", F32, true, ""},
		{"fp32", F32, true, ""},
		{"float", F32, true, ""},
		{"fp8", F32, false, `"fp8" is not supported`},
	} {
		got, set, err := ParseElemType(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseElemType(%q) error = %v, want one containing %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want || set != tc.set {
			t.Errorf("ParseElemType(%q) = %v, %v, %v; want %v, %v, nil", tc.in, got, set, err, tc.want, tc.set)
		}
	}
}

// TestElemTypeStringRoundTrips checks that the names String writes (the
// side channel's handshake carries them) parse back to the same type.
func TestElemTypeStringRoundTrips(t *testing.T) {
	for _, e := range []ElemType{F32, BF16} {
		got, set, err := ParseElemType(e.String())
		if err != nil || !set || got != e {
			t.Errorf("ParseElemType(%v.String()) = %v, %v, %v", e, got, set, err)
		}
	}
	if s := ElemType(2).String(); s != "ElemType(2)" {
		t.Errorf("ElemType(2).String() = %q", s)
	}
	if ElemType(2).Valid() {
		t.Error("ElemType(2) is valid")
	}
}

func TestLayoutSizes(t *testing.T) {
	l := Layout{BlockSize: 4, Layers: 2, KVHeads: 3, HeadDim: 8, DType: BF16}
	if got := l.TokenElems(); got != 24 {
		t.Errorf("TokenElems = %d, want 24", got)
	}
	if got := l.BlockElems(); got != 2*2*4*24 {
		t.Errorf("BlockElems = %d, want %d", got, 2*2*4*24)
	}
	if got := l.BlockBytes(); got != 2*l.BlockElems() {
		t.Errorf("bf16 BlockBytes = %d, want %d", got, 2*l.BlockElems())
	}
	l.DType = F32
	if got := l.BlockBytes(); got != 4*l.BlockElems() {
		t.Errorf("f32 BlockBytes = %d, want %d", got, 4*l.BlockElems())
	}
	// The V row of slot 1, layer 1, block 2: past two whole blocks, the K
	// and V of layer 0 and the K of layer 1 (three runs of BlockSize
	// rows), and one row.
	if got, want := l.Offset(2, 1, 1, 1), 2*l.BlockElems()+(3*4+1)*24; got != want {
		t.Errorf("Offset(2, 1, 1, 1) = %d, want %d", got, want)
	}
}

// TestGroupedGemma3 checks vLLM's grouping on Gemma 3 1B's 26 layers (every
// sixth layer global, window 512): four full layers give the group size,
// the 22 sliding ones fill six groups, the last padded.
func TestGroupedGemma3(t *testing.T) {
	windows := make([]int, 26)
	for i := range windows {
		if (i+1)%6 != 0 {
			windows[i] = 512
		}
	}
	g := Grouped(windows)
	if len(g) != 7 || g[0].Window != 0 || len(g[0].Layers) != 4 || g[0].Layers[0] != 5 || g[0].Layers[3] != 23 {
		t.Fatalf("Grouped = %+v, want a full group of layers 5, 11, 17, 23 first and 7 groups", g)
	}
	for _, gr := range g[1:] {
		if gr.Window != 512 {
			t.Errorf("sliding group %+v has window %d", gr, gr.Window)
		}
	}
	if n := len(g[6].Layers); n != 2 {
		t.Errorf("last sliding group has %d layers, want 2 (24, 25)", n)
	}
	if PageLayers(g) != 4 {
		t.Errorf("PageLayers = %d, want 4", PageLayers(g))
	}
	slots := LayerSlots(g, 26)
	if slots[5] != (LayerSlot{0, 0}) || slots[23] != (LayerSlot{0, 3}) || slots[4] != (LayerSlot{2, 0}) || slots[25] != (LayerSlot{6, 1}) {
		t.Errorf("LayerSlots = %v", slots)
	}
	if w := Windows(g); len(w) != 7 || w[0] != 0 || w[1] != 512 {
		t.Errorf("Windows = %v", w)
	}
}

// TestGroupedUniform checks that a model of one attention type is one group
// of every layer (today's layout), and that nearly equal counts use the
// larger group size.
func TestGroupedUniform(t *testing.T) {
	for _, windows := range [][]int{{0, 0, 0}, {8, 8, 8}} {
		g := Grouped(windows)
		if len(g) != 1 || len(g[0].Layers) != 3 || g[0].Window != windows[0] {
			t.Errorf("Grouped(%v) = %+v, want one group of 3 layers", windows, g)
		}
		if Windows(g) == nil != (windows[0] == 0) {
			t.Errorf("Windows(%+v) = %v", g, Windows(g))
		}
	}
	if g := Single([]int{0, 8}); len(g) != 1 || g[0].Window != 0 {
		t.Errorf("Single of mixed windows = %+v, want one full group", g)
	}
	// 5 full and 6 sliding: 6 < 1.25·5, so groups of 6.
	w := []int{0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 4}
	if g := Grouped(w); len(g) != 2 || PageLayers(g) != 6 || len(g[0].Layers) != 5 {
		t.Errorf("Grouped(%v) = %+v, want two groups, pages of 6", w, g)
	}
}

func TestFirstNeeded(t *testing.T) {
	for _, tc := range []struct{ win, p, want int }{
		{0, 1000, 0}, {512, 100, 0}, {512, 511, 0}, {512, 512 + 63, 64}, {512, 512 + 64, 64}, {512, 512 + 65, 64}, {512, 640, 128}, {4, 200, 192},
	} {
		if got := FirstNeeded(tc.win, tc.p); got != tc.want {
			t.Errorf("FirstNeeded(%d, %d) = %d, want %d", tc.win, tc.p, got, tc.want)
		}
	}
}

// TestSeqBlocks checks the blocks a long sequence holds at once: every
// block in a full-attention group, a window, a key chunk and a step's
// tokens in a sliding one.
func TestSeqBlocks(t *testing.T) {
	if got := SeqBlocks(nil, 16, 32768, 2048); got != 2048 {
		t.Errorf("one group: %d blocks, want 2048", got)
	}
	// Gemma 3 1B at 32k: one full group of 2048 blocks and six sliding
	// ones of (512+64+2048)/16+1 = 165 each.
	w := []int{0, 512, 512, 512, 512, 512, 512}
	if got := SeqBlocks(w, 16, 32768, 2048); got != 2048+6*165 {
		t.Errorf("Gemma 3 1B groups: %d blocks, want %d", got, 2048+6*165)
	}
	if got := SeqBlocks(w, 16, 100, 2048); got != 7*7 {
		t.Errorf("a short sequence: %d blocks, want 49 (7 in every group)", got)
	}
}
