package main

// Addressing and loading the 8 weight rows of the AVX2 pack kernels
// (quant_avx2.go): row addresses (a rowSet, quantrows.go), transposes, and
// the f16 scales gathered and widened.

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// rows8 addresses the 8 weight rows of an AVX2 pack or row kernel.
type rows8 struct{ rowSet }

// newRows8 emits the registers of 8 rows L bytes apart from base.
func newRows8(base, L GPVirtual) rows8 { return rows8{newRowSet(base, L, 8)} }

// transpose8x8 loads 8 dwords at disp of each of the 8 rows and returns
// t[i], whose lane l is dword i of row l.
func transpose8x8(r rows8, disp int) [8]VecVirtual {
	var b [2][4]VecVirtual
	for h := range 2 {
		var a [4]VecVirtual
		for p := range 2 {
			y0, y1 := YMM(), YMM()
			VMOVDQU(r.at(4*h+2*p, disp), y0)
			VMOVDQU(r.at(4*h+2*p+1, disp), y1)
			a[2*p], a[2*p+1] = YMM(), YMM()
			VPUNPCKLDQ(y1, y0, a[2*p])
			VPUNPCKHDQ(y1, y0, a[2*p+1])
		}
		for i := range 4 {
			b[h][i] = YMM()
		}
		VPUNPCKLQDQ(a[2], a[0], b[h][0])
		VPUNPCKHQDQ(a[2], a[0], b[h][1])
		VPUNPCKLQDQ(a[3], a[1], b[h][2])
		VPUNPCKHQDQ(a[3], a[1], b[h][3])
	}
	// b[h][i]: rows 4h..4h+3, dword i in the low 128 bits, 4+i in the high.
	var t [8]VecVirtual
	for i := range 4 {
		t[i], t[4+i] = YMM(), YMM()
		VPERM2I128(U8(0x20), b[1][i], b[0][i], t[i])
		VPERM2I128(U8(0x31), b[1][i], b[0][i], t[4+i])
	}
	return t
}

// transpose8x4 loads 4 dwords at disp of each of the 8 rows and returns
// t[i], whose lane l is dword i of row l.
func transpose8x4(r rows8, disp int) [4]VecVirtual {
	var z [4]VecVirtual
	for g := range 4 {
		z[g] = YMM()
		VBROADCASTI128(r.at(g, disp), z[g])
		VINSERTI128(U8(1), r.at(4+g, disp), z[g], z[g])
	}
	return transpose4x4(avx2, z)
}

// halvesToF32 converts the f16 in the low halves of the dwords of v (the
// high halves zero) to 8 f32.
func halvesToF32(v VecVirtual) VecVirtual {
	p := YMM()
	VPACKUSDW(v, v, p)
	q := YMM()
	VPERMQ(U8(0x08), p, q)
	f := YMM()
	VCVTPH2PS(q.AsX(), f)
	return f
}

// gatherF16x8 returns the f16 at disp of each of the 8 rows widened to
// f32 (the dword from disp must be readable; with high the f16 is its top
// half).
func gatherF16x8(r rows8, idx, ones, lo16 VecVirtual, disp int, high bool) VecVirtual {
	mask := YMM()
	VMOVDQA(ones, mask)
	g := YMM()
	VXORPS(g, g, g)
	VPGATHERDD(mask, Mem{Base: r.bases[0], Index: idx, Scale: 1, Disp: disp}, g)
	if high {
		VPSRLD(U8(16), g, g)
	} else {
		VPAND(lo16, g, g)
	}
	return halvesToF32(g)
}

// rowIndex8 returns the gather index vector l·L for l < 8.
func rowIndex8(L GPVirtual) VecVirtual {
	x := XMM()
	VMOVD(L.As32(), x)
	b := YMM()
	VPBROADCASTD(x, b)
	idx := YMM()
	VPMULLD(iotaTable(), b, idx)
	return idx
}
