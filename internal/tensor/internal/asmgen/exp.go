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
