package main

// What the activation quantizers do the same way on AVX-512 (qact.go) and
// AVX2 (qactavx2.go): the loads of their arguments, each block's scale and
// the advance to the next block; for q8_K also the shortcut for a block of
// zeros. Only the vector width and the way a compare becomes a bit mask
// differ.

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// qact8KBlock is what qact8KScale leaves to the level pass of one block.
type qact8KBlock struct {
	s              isa
	x, nb, q, meta Register
	zero           VecVirtual // all bits zero
	is             VecVirtual // XMM: −127/mx, the inverse scale (mx the block's first value of largest magnitude)
	isb            VecVirtual // is in every lane
}

// qact8KScale emits the start of a q8_K quantizer on s after its TEXT: the
// arguments (x *float32, nb int, q *int8, meta *uint32), then, for each
// block of 256 values (label block), the largest magnitude amax. A block
// whose amax is zero gets zero levels and metadata and goes on at label
// next (qact8KBlock.next); any other block finds its first value of largest
// magnitude mx, which gives the scale its sign, and leaves is = −127/mx.
func qact8KScale(s isa) qact8KBlock {
	vb := 4 * s.lanes // bytes per vector
	splatS, hmax := splat8, hmaxPS8
	if s.lanes == 16 {
		splatS, hmax = splat, hmaxPS
	}
	b := qact8KBlock{s: s}
	b.x = Load(Param("x"), GP64())
	b.nb = Load(Param("nb"), GP64())
	b.q = Load(Param("q"), GP64())
	b.meta = Load(Param("meta"), GP64())
	absMask := splatS(0x7fffffff)
	TESTQ(b.nb, b.nb)
	JE(LabelRef("done"))
	Label("block")
	m := s.vec()
	VXORPS(m, m, m)
	for v := range 1024 / vb {
		a := s.vec()
		VANDPS(Mem{Base: b.x, Disp: vb * v}, absMask, a)
		VMAXPS(m, a, m) // a NaN lane keeps m
	}
	amax := hmax(m)
	z := XMM()
	VXORPS(z, z, z)
	b.zero = s.vec()
	VXORPS(b.zero, b.zero, b.zero)
	VUCOMISS(z, amax)
	JNE(LabelRef("nonzero"))
	for i := range 256 / vb {
		b.store(Mem{Base: b.q, Disp: vb * i})
	}
	b.clearMeta()
	JMP(LabelRef("next"))
	Label("nonzero")
	// The first value of largest magnitude gives the scale its sign.
	amaxV := s.vec()
	VBROADCASTSS(amax, amaxV)
	i, bits := GP64(), GP32()
	XORQ(i, i)
	Label("find")
	a := s.vec()
	VANDPS(Mem{Base: b.x, Index: i, Scale: 4}, absMask, a)
	if s.lanes == 16 {
		k := K()
		VCMPPS(U8(0), amaxV, a, k) // equal
		KMOVW(k, bits)
	} else {
		VCMPPS(U8(0), amaxV, a, a) // equal
		VMOVMSKPS(a, bits)
	}
	TESTL(bits, bits)
	JNE(LabelRef("found"))
	ADDQ(U8(s.lanes), i)
	JMP(LabelRef("find"))
	Label("found")
	at := GP32()
	BSFL(bits, at)
	ADDL(i.As32(), at)
	mx := XMM()
	VMOVSS(Mem{Base: b.x, Index: at.As64(), Scale: 4}, mx)
	b.is = XMM()
	VDIVSS(mx, splatS(math.Float32bits(-127)).AsX(), b.is)
	b.isb = s.vec()
	VBROADCASTSS(b.is, b.isb)
	return b
}

// store stores the zero vector at m.
func (b qact8KBlock) store(m Mem) {
	if b.s.lanes == 16 {
		VMOVDQU64(b.zero, m)
	} else {
		VMOVDQU(b.zero, m)
	}
}

// clearMeta zeroes the block's metaKBytes of metadata.
func (b qact8KBlock) clearMeta() {
	vb := 4 * b.s.lanes
	for i := range metaKBytes / vb {
		b.store(Mem{Base: b.meta, Disp: vb * i})
	}
}

// next emits the advance to the next block (label next, where a
// block of zeros goes on) and the return.
func (b qact8KBlock) next() {
	Label("next")
	ADDQ(U32(1024), b.x)
	ADDQ(U32(256), b.q)
	ADDQ(U32(metaKBytes), b.meta)
	DECQ(b.nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// qact8_0Args holds a q8_0 quantizer's arguments and constants.
type qact8_0Args struct {
	s                            isa
	x, nb, q, meta, cm           Register
	absMask, signMask, one, half VecVirtual
}

// loadQact8_0 emits the loads of a q8_0 quantizer's arguments (x *float32,
// nb int, q *int8, meta *uint32, corrMul int) and of its constants on s.
func loadQact8_0(s isa) qact8_0Args {
	splatS := splat8
	if s.lanes == 16 {
		splatS = splat
	}
	a := qact8_0Args{s: s}
	a.x = Load(Param("x"), GP64())
	a.nb = Load(Param("nb"), GP64())
	a.q = Load(Param("q"), GP64())
	a.meta = Load(Param("meta"), GP64())
	a.cm = Load(Param("corrMul"), GP64())
	a.absMask = splatS(0x7fffffff)
	a.signMask = splatS(0x80000000)
	a.one = splatS(math.Float32bits(1))
	a.half = splatS(math.Float32bits(0.5))
	return a
}

// scale emits a q8_0 block's scale from its largest magnitude amax (XMM):
// d = amax/127 rounded to f16, stored at meta, and returns 1/d (0 where d
// is 0) in every lane. c127 holds 127 in its low lane.
func (a qact8_0Args) scale(amax, c127 Op) VecVirtual {
	d := XMM()
	VDIVSS(c127, amax, d)
	id := XMM()
	VDIVSS(d, a.one.AsX(), id)
	z := XMM()
	VXORPS(z, z, z)
	isZero := XMM()
	VCMPSS(U8(0), z, d, isZero) // d == 0
	VANDNPS(id, isZero, id)
	h := XMM()
	VCVTPS2PH(U8(0), d, h)
	VCVTPH2PS(h, d)
	VMOVSS(d, Mem{Base: a.meta})
	ib := a.s.vec()
	VBROADCASTSS(id, ib)
	return ib
}

// next emits the store of a q8_0 block's correction, sum (the sum of its
// levels) times corrMul, the advance to the next block and the return.
func (a qact8_0Args) next(sum GPVirtual) {
	IMULL(a.cm.(GPVirtual).As32(), sum)
	MOVL(sum, Mem{Base: a.meta, Disp: 4})
	ADDQ(U32(128), a.x)
	ADDQ(U32(32), a.q)
	ADDQ(U32(8), a.meta)
	DECQ(a.nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}
