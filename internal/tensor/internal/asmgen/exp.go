package main

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Constants of the vector exponential, each stored 16 times (one zmm).
const (
	cExpLo = iota
	cExpHi
	cLog2e
	cLn2Hi
	cLn2Lo
	cP0
	cP1
	cP2
	cP3
	cP4
	cP5
	cOne
	cBias
	nConsts
)

var (
	constTable Mem // expconst: nConsts × 16 float32
	maskTable  Mem // tailmask8: 8 × -1 then 8 × 0 (AVX2 tail masks)
)

// constants emits the read-only tables the vector exponential and the AVX2
// tails use.
func constants() {
	vals := [nConsts]float32{
		cExpLo: -104, // e^x rounds to zero below this
		cExpHi: 89,   // e^x overflows above 88.72
		cLog2e: 1.44269504088896341,
		cLn2Hi: 0.693359375,
		cLn2Lo: -2.12194440e-4,
		// Cephes expf minimax polynomial for e^r on [-ln2/2, ln2/2].
		cP0: 1.9875691500e-4, cP1: 1.3981999507e-3, cP2: 8.3334519073e-3,
		cP3: 4.1665795894e-2, cP4: 1.6666665459e-1, cP5: 5.0000001201e-1,
		cOne: 1,
	}
	constTable = GLOBL("expconst", RODATA|NOPTR)
	for c := range nConsts {
		for l := range 16 {
			off := (c*16 + l) * 4
			if c == cBias {
				DATA(off, U32(127))
			} else {
				DATA(off, U32(math.Float32bits(vals[c])))
			}
		}
	}
	maskTable = GLOBL("tailmask8", RODATA|NOPTR)
	for l := range 16 {
		v := uint32(0)
		if l < 8 {
			v = 0xffffffff
		}
		DATA(l*4, U32(v))
	}
}

func cnst(c int) Mem { return constTable.Offset(c * 64) }

// exp replaces the lanes of v with e^v: clamp v to [-104, 89], n =
// round(v·log2e), r = v - n·ln2 (two-part ln2), e^r by the Cephes degree-6
// polynomial with FMAs, then scale by 2^n as two exact power-of-two factors
// 2^⌊n/2⌋·2^(n-⌊n/2⌋), so overflow gives +Inf and underflow rounds once to
// a subnormal or zero. NaN lanes stay NaN.
func exp(s isa, v VecVirtual) {
	t := s.vec()
	VMOVUPS(cnst(cExpLo), t)
	VMAXPS(v, t, v) // Intel order max(t, v): returns v when v is NaN
	VMOVUPS(cnst(cExpHi), t)
	VMINPS(v, t, v)
	n := s.vec()
	VMULPS(cnst(cLog2e), v, n)
	if s.lanes == 16 {
		VRNDSCALEPS(U8(0), n, n)
	} else {
		VROUNDPS(U8(0), n, n)
	}
	VFNMADD231PS(cnst(cLn2Hi), n, v) // v -= n·ln2hi
	VFNMADD231PS(cnst(cLn2Lo), n, v) // v -= n·ln2lo
	p := s.vec()
	VMOVUPS(cnst(cP0), p)
	for _, c := range []int{cP1, cP2, cP3, cP4, cP5} {
		VFMADD213PS(cnst(c), v, p) // p = p·r + c
	}
	r2 := s.vec()
	VMULPS(v, v, r2)
	VFMADD213PS(v, r2, p) // p = p·r² + r
	VADDPS(cnst(cOne), p, p)
	ni := s.vec()
	VCVTPS2DQ(n, ni)
	h := s.vec()
	VPSRAD(U8(1), ni, h)
	VPSUBD(h, ni, ni)
	VPADDD(cnst(cBias), h, h)
	VPADDD(cnst(cBias), ni, ni)
	VPSLLD(U8(23), h, h)
	VPSLLD(U8(23), ni, ni)
	VMULPS(h, p, p)
	VMULPS(ni, p, v)
}

// elementwise emits a loop over n float32 lanes calling body on full vectors
// and on a final partial vector (AVX-512: mask register; AVX2: mask vector
// from tailmask8). load(mem, dst, mask) and store(src, mem, mask) handle the
// masking; mask is nil for full vectors.
type lanesOp struct {
	load  func(m Mem, dst VecVirtual)
	store func(src VecVirtual, m Mem)
}

func elementwise(s isa, n Register, body func(idx GPVirtual, op lanesOp)) {
	nv := GP64()
	MOVQ(n, nv)
	ANDQ(I32(-s.lanes), nv)
	idx := GP64()
	XORQ(idx, idx)
	TESTQ(nv, nv)
	JE(LabelRef("tail"))
	Label("loop")
	body(idx, lanesOp{
		load:  func(m Mem, dst VecVirtual) { VMOVUPS(m, dst) },
		store: func(src VecVirtual, m Mem) { VMOVUPS(src, m) },
	})
	ADDQ(U32(s.lanes), idx)
	CMPQ(idx, nv)
	JL(LabelRef("loop"))
	Label("tail")
	CMPQ(idx, n)
	JE(LabelRef("done"))
	if s.lanes == 16 {
		mask := tailMask(n)
		body(idx, lanesOp{
			load:  func(m Mem, dst VecVirtual) { VMOVUPS_Z(m, mask, dst) },
			store: func(src VecVirtual, m Mem) { VMOVUPS(src, mask, m) },
		})
	} else {
		mask := avx2Mask(n)
		body(idx, lanesOp{
			load:  func(m Mem, dst VecVirtual) { VMASKMOVPS(m, mask, dst) },
			store: func(src VecVirtual, m Mem) { VMASKMOVPS(src, mask, m) },
		})
	}
	Label("done")
}

// avx2Mask returns a vector whose first n%8 lanes are all ones.
func avx2Mask(n Register) VecVirtual {
	t := GP64()
	MOVQ(n, t)
	ANDQ(U32(7), t)
	NEGQ(t)
	base := GP64()
	LEAQ(maskTable, base)
	m := YMM()
	VMOVUPS(Mem{Base: base, Index: t, Scale: 4, Disp: 32}, m)
	return m
}

// siluMul emits gate[t] = gate[t]/(1+e^-gate[t])·up[t] for t < n.
func siluMul(s isa) {
	name := "siluMul" + s.name
	TEXT(name, NOSPLIT, "func(gate, up *float32, n int)")
	Doc(name + " computes gate[t] = silu(gate[t])·up[t] for t < n.")
	g := Load(Param("gate"), GP64())
	u := Load(Param("up"), GP64())
	n := Load(Param("n"), GP64())
	elementwise(s, n, func(idx GPVirtual, op lanesOp) {
		x := s.vec()
		op.load(Mem{Base: g, Index: idx, Scale: 4}, x)
		e := s.vec()
		VXORPS(e, e, e)
		VSUBPS(x, e, e) // -x
		exp(s, e)
		VADDPS(cnst(cOne), e, e)
		VDIVPS(e, x, x)
		up := s.vec()
		op.load(Mem{Base: u, Index: idx, Scale: 4}, up)
		VMULPS(up, x, x)
		op.store(x, Mem{Base: g, Index: idx, Scale: 4})
	})
	VZEROUPPER()
	RET()
}

// expSum emits x[t] = e^(x[t]-mx) for t < n and returns Σ x[t], summed in one
// vector accumulator reduced by the fixed tree.
func expSum(s isa) {
	name := "expSum" + s.name
	TEXT(name, NOSPLIT, "func(x *float32, n int, mx float32) float32")
	Doc(name + " computes x[t] = exp(x[t]-mx) for t < n and returns their sum.")
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	m := s.vec()
	VBROADCASTSS(NewParamAddr("mx", 16), m)
	acc := s.vec()
	VXORPS(acc, acc, acc)
	if s.lanes == 8 {
		expSumPairsAVX2(x, n, m, acc)
	}
	elementwise(s, n, func(idx GPVirtual, op lanesOp) {
		v := s.vec()
		op.load(Mem{Base: x, Index: idx, Scale: 4}, v)
		VSUBPS(m, v, v)
		exp(s, v)
		op.store(v, Mem{Base: x, Index: idx, Scale: 4})
		z := s.vec()
		VXORPS(z, z, z)
		op.load(Mem{Base: x, Index: idx, Scale: 4}, z) // masked lanes read as zero
		VADDPS(z, acc, acc)
	})
	sum := reduce(s, acc)
	Store(sum, ReturnIndex(0))
	VZEROUPPER()
	RET()
}

// expPairWidth is how many vectors expSumPairsAVX2 computes side by side:
// 2 took a 64-element ExpSum from 74.5 to 63.4 ns on the AMD Zen 2 it was
// measured on, 3 to 67 ns; 4 needs more than AVX2's 16 vector registers
// (the allocator then picks Y16 and up, which only EVEX encodes).
const expPairWidth = 2

// expSumPairsAVX2 emits, ahead of expSum's loop on AVX2, a loop over
// expPairWidth whole vectors at a time whose exponentials are computed
// side by side, instruction by instruction (each vector's lanes see
// exactly exp's operations), and added to acc in element order, as the
// one-vector loop adds them: the results and the sum are bit-identical.
// One vector's exponential is a chain of ~25 dependent instructions; one
// chain at a time filled the core's FP scheduler with operations waiting
// on each other, so few vectors overlapped. It advances x and lowers n by
// the elements done, leaving the rest to expSum's loop.
func expSumPairsAVX2(x, n Register, m, acc VecVirtual) {
	const w = expPairWidth
	Label("pairs")
	CMPQ(n, U32(8*w))
	JL(LabelRef("pairsdone"))
	vs := make([]VecVirtual, w)
	for i := range vs {
		vs[i] = YMM()
		VMOVUPS(Mem{Base: x, Disp: 32 * i}, vs[i])
	}
	each := func(f func(i int)) {
		for i := range w {
			f(i)
		}
	}
	each(func(i int) { VSUBPS(m, vs[i], vs[i]) })
	ts := make([]VecVirtual, w)
	each(func(i int) { ts[i] = YMM(); VMOVUPS(cnst(cExpLo), ts[i]) })
	each(func(i int) { VMAXPS(vs[i], ts[i], vs[i]) }) // Intel order max(t, v): returns v when v is NaN
	each(func(i int) { VMOVUPS(cnst(cExpHi), ts[i]) })
	each(func(i int) { VMINPS(vs[i], ts[i], vs[i]) })
	ns := make([]VecVirtual, w)
	each(func(i int) { ns[i] = YMM(); VMULPS(cnst(cLog2e), vs[i], ns[i]) })
	each(func(i int) { VROUNDPS(U8(0), ns[i], ns[i]) })
	each(func(i int) { VFNMADD231PS(cnst(cLn2Hi), ns[i], vs[i]) })
	each(func(i int) { VFNMADD231PS(cnst(cLn2Lo), ns[i], vs[i]) })
	ps := make([]VecVirtual, w)
	each(func(i int) { ps[i] = YMM(); VMOVUPS(cnst(cP0), ps[i]) })
	for _, c := range []int{cP1, cP2, cP3, cP4, cP5} {
		each(func(i int) { VFMADD213PS(cnst(c), vs[i], ps[i]) })
	}
	r2 := make([]VecVirtual, w)
	each(func(i int) { r2[i] = YMM(); VMULPS(vs[i], vs[i], r2[i]) })
	each(func(i int) { VFMADD213PS(vs[i], r2[i], ps[i]) })
	each(func(i int) { VADDPS(cnst(cOne), ps[i], ps[i]) })
	nis := make([]VecVirtual, w)
	each(func(i int) { nis[i] = YMM(); VCVTPS2DQ(ns[i], nis[i]) })
	hs := make([]VecVirtual, w)
	each(func(i int) { hs[i] = YMM(); VPSRAD(U8(1), nis[i], hs[i]) })
	each(func(i int) { VPSUBD(hs[i], nis[i], nis[i]) })
	each(func(i int) { VPADDD(cnst(cBias), hs[i], hs[i]) })
	each(func(i int) { VPADDD(cnst(cBias), nis[i], nis[i]) })
	each(func(i int) { VPSLLD(U8(23), hs[i], hs[i]) })
	each(func(i int) { VPSLLD(U8(23), nis[i], nis[i]) })
	each(func(i int) { VMULPS(hs[i], ps[i], ps[i]) })
	each(func(i int) { VMULPS(nis[i], ps[i], vs[i]) })
	each(func(i int) {
		VMOVUPS(vs[i], Mem{Base: x, Disp: 32 * i})
		VADDPS(vs[i], acc, acc)
	})
	ADDQ(U32(32*w), x)
	SUBQ(U32(8*w), n)
	JMP(LabelRef("pairs"))
	Label("pairsdone")
}
