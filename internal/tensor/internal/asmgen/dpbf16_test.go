package main

import (
	"bytes"
	"testing"
)

// TestEVEXEncodings checks the hand-made encodings against GNU as 2.x
// (objdump of `vdpbf16ps %zmm3,%zmm2,%zmm1` and friends, and of the
// embedded-broadcast forms with every addressing shape).
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
	bcst := func(base, index, scale, disp, src1, dst int) []byte {
		b, err := encodeDPBF16PSBcst(base, index, scale, disp, src1, dst)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests = append(tests, []struct {
		name string
		got  []byte
		want []byte
	}{
		{"vdpbf16ps (%rax,%r10,1){1to16},%zmm4,%zmm0", bcst(0, 10, 1, 0, 4, 0), []byte{0x62, 0xb2, 0x5e, 0x58, 0x52, 0x04, 0x10}},
		{"vdpbf16ps 0x0(%r13,%r10,1){1to16},%zmm20,%zmm17", bcst(13, 10, 1, 0, 20, 17), []byte{0x62, 0x82, 0x5e, 0x50, 0x52, 0x4c, 0x15, 0x00}},
		{"vdpbf16ps (%rsi){1to16},%zmm4,%zmm0", bcst(6, -1, 1, 0, 4, 0), []byte{0x62, 0xf2, 0x5e, 0x58, 0x52, 0x06}},
		{"vdpbf16ps (%r12){1to16},%zmm4,%zmm0", bcst(12, -1, 1, 0, 4, 0), []byte{0x62, 0xd2, 0x5e, 0x58, 0x52, 0x04, 0x24}},
		{"vdpbf16ps 0x0(%rbp){1to16},%zmm4,%zmm9", bcst(5, -1, 1, 0, 4, 9), []byte{0x62, 0x72, 0x5e, 0x58, 0x52, 0x4d, 0x00}},
		{"vdpbf16ps 0x40(%rdi,%rcx,4){1to16},%zmm31,%zmm16", bcst(7, 1, 4, 64, 31, 16), []byte{0x62, 0xe2, 0x06, 0x50, 0x52, 0x44, 0x8f, 0x10}},
		{"vdpbf16ps 0x1000(%r8){1to16},%zmm1,%zmm2", bcst(8, -1, 1, 4096, 1, 2), []byte{0x62, 0xd2, 0x76, 0x58, 0x52, 0x90, 0x00, 0x10, 0x00, 0x00}},
		{"vdpbf16ps -0x8(%rsp){1to16},%zmm1,%zmm2", bcst(4, -1, 1, -8, 1, 2), []byte{0x62, 0xf2, 0x76, 0x58, 0x52, 0x54, 0x24, 0xfe}},
		{"vdpbf16ps 0x3(%r9,%r15,8){1to16},%zmm17,%zmm8", bcst(9, 15, 8, 3, 17, 8), []byte{0x62, 0x12, 0x76, 0x50, 0x52, 0x84, 0xf9, 0x03, 0x00, 0x00, 0x00}},
	}...)
	for _, tc := range tests {
		if !bytes.Equal(tc.got, tc.want) {
			t.Errorf("%s: got % x, want % x", tc.name, tc.got, tc.want)
		}
	}
}
