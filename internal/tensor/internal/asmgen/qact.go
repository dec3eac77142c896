package main

// The activation quantizers of the quantized matrix kernels (quant.go and
// rowquant.go): rows of f32 activations to q8_0 blocks (for Q8_0, Q4_0 and
// Q5_0 weights) or q8_K super-blocks (for the K-quants), with the
// per-block metadata the dot kernels need, bit-identical to package
// tensor's Go quantizers.

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// hmaxPS returns an XMM whose low lane is the largest of the 16 lanes of
// v (no NaNs among them): the lane-wise larger of its two halves, then
// hmaxPS8.
func hmaxPS(v VecVirtual) VecVirtual {
	y := YMM()
	VEXTRACTF32X8(U8(1), v, y)
	VMAXPS(y, v.AsY(), y)
	return hmaxPS8(y)
}

// hsumD returns a GP register holding the sum of the 16 int32 lanes of v:
// the lane-wise sum of its two halves, then hsumD8.
func hsumD(v VecVirtual) GPVirtual {
	y := YMM()
	VEXTRACTI64X4(U8(1), v, y)
	VPADDD(y, v.AsY(), y)
	return hsumD8(y)
}

// splatF returns a ZMM holding f in every lane.
func splatF(f float32) VecVirtual { return splat(math.Float32bits(f)) }

// qact8_0 emits the AVX-512 activation quantizer for Q8_0/Q4_0 weights:
// ggml's q8_0 per 32 values, exactly as quantizeActQ8_0 does it for finite
// inputs (round half away from zero as a truncation plus a correction, so
// it matches math.Round).
func qact8_0() {
	TEXT("qactQ8_0AVX512", NOSPLIT, "func(x *float32, nb int, q *int8, meta *uint32, corrMul int)")
	Doc("qactQ8_0AVX512 quantizes nb blocks of 32 activations to q8_0 levels and their scale and correction (see quantizeActQ8_0).")
	args := loadQact8_0(avx512)
	x, nb, q, absMask, signMask, one, half := args.x, args.nb, args.q, args.absMask, args.signMask, args.one, args.half
	c127 := splatF(127)
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	v := [2]VecVirtual{ZMM(), ZMM()}
	VMOVUPS(Mem{Base: x}, v[0])
	VMOVUPS(Mem{Base: x, Disp: 64}, v[1])
	a0, a1 := ZMM(), ZMM()
	VANDPS(absMask, v[0], a0)
	VANDPS(absMask, v[1], a1)
	VMAXPS(a1, a0, a0)
	amax := hmaxPS(a0)
	ib := args.scale(amax, c127.AsX())
	var iv [2]VecVirtual
	for i := range 2 {
		p := ZMM()
		VMULPS(ib, v[i], p)
		t := ZMM()
		VRNDSCALEPS(U8(0x0b), p, t) // truncate
		f := ZMM()
		VSUBPS(t, p, f)
		VANDPS(absMask, f, f)
		k := K()
		VCMPPS(U8(0x1d), half, f, k) // |p − t| ≥ 0.5
		s := ZMM()
		VMOVAPS(one, s)
		VPTERNLOGD(U8(0xf8), signMask, p, s) // ±1 with p's sign
		VADDPS(s, t, k, t)
		iv[i] = ZMM()
		VCVTTPS2DQ(t, iv[i])
		b := XMM()
		VPMOVSDB(iv[i], b)
		VMOVDQU(b, Mem{Base: q, Disp: 16 * i})
	}
	VPADDD(iv[1], iv[0], iv[0])
	sum := hsumD(iv[0])
	args.next(sum)
}

// qact8K emits the AVX-512 activation quantizer for the K-quants: ggml's
// q8_K per 256 values, exactly as quantizeActQ8K does it for finite
// inputs, with the sums per 16 (and 32) from VPSADBW.
func qact8K() {
	TEXT("qactQ8KAVX512", NOSPLIT, "func(x *float32, nb int, q *int8, meta *uint32)")
	Doc("qactQ8KAVX512 quantizes nb blocks of 256 activations to q8_K levels, scale and sums (see quantizeActQ8K).")
	blk := qact8KScale(avx512)
	x, q, meta, zero, is, isb := blk.x, blk.q, blk.meta, blk.zero, blk.is, blk.isb
	c127 := splat(127)
	for v := range 16 {
		p := ZMM()
		VMULPS(Mem{Base: x, Disp: 64 * v}, isb, p)
		iv := ZMM()
		VCVTPS2DQ(p, iv) // nearest, ties to even
		VPMINSD(c127, iv, iv)
		b := XMM()
		VPMOVSDB(iv, b)
		VMOVDQU(b, Mem{Base: q, Disp: 16 * v})
	}
	d := XMM()
	VDIVSS(is, splatF(1).AsX(), d)
	blk.clearMeta()
	VMOVSS(d, Mem{Base: meta})
	// Sums per 16: VPSADBW of the levels + 128 sums 8 of them per qword.
	c80 := splat(0x80808080)
	var s [4]VecVirtual
	for v := range 4 {
		s[v] = ZMM()
		VPXORD(Mem{Base: q, Disp: 64 * v}, c80, s[v])
		VPSADBW(zero, s[v], s[v])
	}
	var w [2]VecVirtual
	for p := range 2 {
		lo, hi := ZMM(), ZMM()
		VPUNPCKLQDQ(s[2*p+1], s[2*p], lo)
		VPUNPCKHQDQ(s[2*p+1], s[2*p], hi)
		VPADDQ(hi, lo, lo)
		w[p] = XMM()
		VPMOVQW(lo, w[p]) // groups 8p + [0 4 1 5 2 6 3 7]
	}
	ws := YMM()
	VINSERTI32X4(U8(1), w[1], w[0].AsY(), ws)
	order := YMM()
	VMOVDQU(sumsOrder(), order)
	VPERMW(ws, order, ws)
	VPSUBW(splat(0x08000800).AsY(), ws, ws) // 16·128 per group
	VMOVDQU(ws, Mem{Base: meta, Disp: metaSums16})
	VPMADDWD(splat(0x00010001).AsY(), ws, ws)
	s32 := XMM()
	VPMOVDW(ws, s32)
	VMOVDQU(s32, Mem{Base: meta, Disp: metaSums32})
	blk.next()
}

// sumsOrderMem is the word permutation table of qact8K, once emitted.
var sumsOrderMem *Mem

// sumsOrder emits (once) the VPERMW indices that put the group sums of
// qact8K in order: group g sits at word 2g (g < 4), 2(g−4)+1 (g < 8), and
// likewise +8 for the second half.
func sumsOrder() Mem {
	if sumsOrderMem != nil {
		return *sumsOrderMem
	}
	t := GLOBL("sums16order", RODATA|NOPTR)
	sumsOrderMem = &t
	for g := range 16 {
		h, r := g/8*8, g%8
		pos := h + 2*r
		if r >= 4 {
			pos = h + 2*(r-4) + 1
		}
		DATA(2*g, U16(uint16(pos)))
	}
	return t
}
