package main

import (
	"bytes"
	"testing"
)

// TestEVEXEncodings checks the hand-made encodings against GNU as 2.x
// (objdump of `vdpbf16ps %zmm3,%zmm2,%zmm1` and friends).
func TestEVEXEncodings(t *testing.T) {
	tests := []struct {
		name string
		got  []byte
		want []byte
	}{
		{"vdpbf16ps %zmm3,%zmm2,%zmm1", encodeDPBF16PS(3, 2, 1), []byte{0x62, 0xf2, 0x6e, 0x48, 0x52, 0xcb}},
		{"vdpbf16ps %zmm19,%zmm18,%zmm17", encodeDPBF16PS(19, 18, 17), []byte{0x62, 0xa2, 0x6e, 0x40, 0x52, 0xcb}},
		{"vdpbf16ps %zmm9,%zmm25,%zmm12", encodeDPBF16PS(9, 25, 12), []byte{0x62, 0x52, 0x36, 0x40, 0x52, 0xe1}},
		{"vcvtneps2bf16 %zmm3,%ymm1", encodeCVTNEPS2BF16(3, 1), []byte{0x62, 0xf2, 0x7e, 0x48, 0x72, 0xcb}},
		{"vcvtneps2bf16 %zmm20,%ymm9", encodeCVTNEPS2BF16(20, 9), []byte{0x62, 0x32, 0x7e, 0x48, 0x72, 0xcc}},
	}
	for _, tc := range tests {
		if !bytes.Equal(tc.got, tc.want) {
			t.Errorf("%s: got % x, want % x", tc.name, tc.got, tc.want)
		}
	}
}
