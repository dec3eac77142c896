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
