package main

// The AVX2 activation quantizers (qact.go has the AVX-512 ones, and
// qactshared.go what both do alike): rows of f32 activations to q8_0 blocks
// or q8_K super-blocks with the metadata the dot kernels need,
// bit-identical to package tensor's quantizeActQ8_0 and quantizeActQ8K for
// finite inputs.

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// hmaxPS8 returns an XMM whose low lane is the largest of the 8 lanes of v
// (no NaNs among them).
func hmaxPS8(v VecVirtual) VecVirtual {
	x := XMM()
	VEXTRACTF128(U8(1), v, x)
	VMAXPS(x, v.AsX(), x)
	x2 := XMM()
	VMOVHLPS(x, x, x2)
	VMAXPS(x2, x, x2)
	x3 := XMM()
	VMOVSHDUP(x2, x3)
	VMAXSS(x3, x2, x3)
	return x3
}

// hsumD8 returns a GP register holding the sum of the 8 int32 lanes of v.
func hsumD8(v VecVirtual) GPVirtual {
	x := XMM()
	VEXTRACTI128(U8(1), v, x)
	VPADDD(x, v.AsX(), x)
	x2 := XMM()
	VPSHUFD(U8(0x4e), x, x2)
	VPADDD(x2, x, x2)
	x3 := XMM()
	VPSHUFD(U8(0xb1), x2, x3)
	VPADDD(x3, x2, x3)
	g := GP32()
	VMOVD(x3, g)
	return g
}

// qact8KAVX2 emits the AVX2 activation quantizer for the K-quants: ggml's
// q8_K per 256 values, exactly as quantizeActQ8K does it for finite inputs
// (what qact8K does with AVX-512).
func qact8KAVX2() {
	TEXT("qactQ8KAVX2", NOSPLIT, "func(x *float32, nb int, q *int8, meta *uint32)")
	Doc("qactQ8KAVX2 quantizes nb blocks of 256 activations to q8_K levels, scale and sums (see quantizeActQ8K).")
	blk := qact8KScale(avx2)
	x, q, meta, is, isb := blk.x, blk.q, blk.meta, blk.is, blk.isb
	c127 := splat8(127)
	order := YMM()
	VMOVDQU(packOrder(), order)
	ones8 := splat8(0x01010101)
	// Sums per 16: VPMADDUBSW by ones gives the pair sums of groups 2c
	// (low lane) and 2c+1 (high lane) of chunk c; three rounds of VPHADDW
	// leave the even groups 0, 2, …, 14 in the low lane and the odd ones
	// in the high lane, one word each.
	var pairs, h1 [2]VecVirtual
	var h2 [2]VecVirtual
	for c := range 8 {
		var iv [4]VecVirtual
		for u := range 4 {
			p := YMM()
			VMULPS(Mem{Base: x, Disp: 128*c + 32*u}, isb, p)
			iv[u] = YMM()
			VCVTPS2DQ(p, iv[u]) // nearest, ties to even
			VPMINSD(c127, iv[u], iv[u])
		}
		b := packLevels32(iv, order)
		VMOVDQU(b, Mem{Base: q, Disp: 32 * c})
		pairs[c%2] = YMM()
		VPMADDUBSW(b, ones8, pairs[c%2])
		if c%2 == 0 {
			continue
		}
		h1[c/2%2] = YMM()
		VPHADDW(pairs[1], pairs[0], h1[c/2%2])
		if c%4 == 3 {
			h2[c/4] = YMM()
			VPHADDW(h1[1], h1[0], h2[c/4])
		}
	}
	d := XMM()
	VDIVSS(is, splatF8(1).AsX(), d)
	blk.clearMeta()
	VMOVSS(d, Mem{Base: meta})
	h3 := YMM()
	VPHADDW(h2[1], h2[0], h3)
	odd := XMM()
	VEXTRACTI128(U8(1), h3, odd)
	lo, hi := XMM(), XMM()
	VPUNPCKLWD(odd, h3.AsX(), lo) // groups 0..7
	VPUNPCKHWD(odd, h3.AsX(), hi) // groups 8..15
	VMOVDQU(lo, Mem{Base: meta, Disp: metaSums16})
	VMOVDQU(hi, Mem{Base: meta, Disp: metaSums16 + 16})
	s32 := XMM()
	VPHADDW(hi, lo, s32)
	VMOVDQU(s32, Mem{Base: meta, Disp: metaSums32})
	blk.next()
}

// packLevels32 packs four vectors of 8 int32 levels in [−127, 127] (32
// consecutive values) to 32 int8 in order: saturating packs, then the dword
// permutation order (packOrder) undoes their lane interleaving.
func packLevels32(iv [4]VecVirtual, order VecVirtual) VecVirtual {
	ab, cd := YMM(), YMM()
	VPACKSSDW(iv[1], iv[0], ab)
	VPACKSSDW(iv[3], iv[2], cd)
	b := YMM()
	VPACKSSWB(cd, ab, b)
	VPERMD(b, order, b)
	return b
}

// qact8_0AVX2 emits the AVX2 activation quantizer for Q8_0/Q4_0/Q5_0
// weights: ggml's q8_0 per 32 values, exactly as quantizeActQ8_0 does it
// for finite inputs (what qact8_0 does with AVX-512: round half away from
// zero as a truncation plus a correction, so it matches math.Round).
func qact8_0AVX2() {
	TEXT("qactQ8_0AVX2", NOSPLIT, "func(x *float32, nb int, q *int8, meta *uint32, corrMul int)")
	Doc("qactQ8_0AVX2 quantizes nb blocks of 32 activations to q8_0 levels and their scale and correction (see quantizeActQ8_0).")
	args := loadQact8_0(avx2)
	x, nb, q, absMask, signMask, one, half := args.x, args.nb, args.q, args.absMask, args.signMask, args.one, args.half
	order := YMM()
	VMOVDQU(packOrder(), order)
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	m := YMM()
	VANDPS(Mem{Base: x}, absMask, m)
	for v := 1; v < 4; v++ {
		a := YMM()
		VANDPS(Mem{Base: x, Disp: 32 * v}, absMask, a)
		VMAXPS(a, m, m)
	}
	amax := hmaxPS8(m)
	ib := args.scale(amax, splatF8(127).AsX())
	var iv [4]VecVirtual
	for i := range 4 {
		p := YMM()
		VMULPS(Mem{Base: x, Disp: 32 * i}, ib, p)
		t := YMM()
		VROUNDPS(U8(3), p, t) // truncate
		f := YMM()
		VSUBPS(t, p, f)
		VANDPS(absMask, f, f)
		VCMPPS(U8(0x1d), half, f, f) // |p − t| ≥ 0.5
		s := YMM()
		VANDPS(signMask, p, s)
		VORPS(one, s, s) // ±1 with p's sign
		VANDPS(f, s, s)
		VADDPS(s, t, t)
		iv[i] = YMM()
		VCVTTPS2DQ(t, iv[i])
	}
	VMOVDQU(packLevels32(iv, order), Mem{Base: q})
	VPADDD(iv[1], iv[0], iv[0])
	VPADDD(iv[3], iv[2], iv[2])
	VPADDD(iv[2], iv[0], iv[0])
	args.next(hsumD8(iv[0]))
}

// splatF8 returns a YMM holding f in every lane.
func splatF8(f float32) VecVirtual { return splat8(math.Float32bits(f)) }

// packOrderMem is the dword permutation table of packLevels32, once
// emitted.
var packOrderMem *Mem

// packOrder emits (once) the VPERMD indices that put the levels of
// packLevels32's packs in order: after VPACKSSDW and VPACKSSWB of four
// vectors a, b, c, d of 8 int32, the dwords hold a0-3 b0-3 c0-3 d0-3
// a4-7 b4-7 c4-7 d4-7.
func packOrder() Mem {
	if packOrderMem != nil {
		return *packOrderMem
	}
	t := GLOBL("qactpackorder", RODATA|NOPTR)
	packOrderMem = &t
	for i, v := range []uint32{0, 4, 1, 5, 2, 6, 3, 7} {
		DATA(4*i, U32(v))
	}
	return t
}
