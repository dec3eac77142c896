package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// cmpGT is VCMPPS's greater-than, ordered and quiet: false for NaN.
const cmpGT = 0x1e

// iotaTable emits iota16, the int32 lane numbers 0..15, once, and returns
// it.
func iotaTable() Mem {
	if iotaMem != nil {
		return *iotaMem
	}
	t := GLOBL("iota16", RODATA|NOPTR)
	iotaMem = &t
	for l := range 16 {
		DATA(l*4, U32(uint32(l)))
	}
	return t
}

// iotaMem is the iota16 table once emitted.
var iotaMem *Mem

// argMaxSets is the number of sets of 16 lanes argMax512 keeps.
const argMaxSets = 4

// argMax512 emits a scan that keeps, per lane, the largest entry seen and
// the index where it was first seen: an entry replaces the lane's only if
// it is greater (so NaN never does and ties keep the first). argMaxSets
// sets of 16 lanes take turns at steps of 16, so their compare-and-move
// chains overlap, and are then reduced to one lane. Lanes start at -Inf
// with index 0, which is the answer when nothing is above -Inf.
func argMax512(iota Mem) {
	const sets = argMaxSets
	TEXT("argMaxAVX512", NOSPLIT, "func(x *float32, n int) int")
	Doc("argMaxAVX512 returns the index of the largest entry of x[:n], the lowest on ties; NaN never wins; 0 if nothing is above -Inf.")
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	neg := GP32()
	MOVL(U32(0xff800000), neg)
	var m, at, cur, v [sets]VecVirtual
	var k [sets]OpmaskVirtual
	t := GP32()
	for s := range sets {
		m[s], at[s], cur[s], v[s], k[s] = ZMM(), ZMM(), ZMM(), ZMM(), K()
		VPBROADCASTD(neg, m[s])
		VPXORD(at[s], at[s], at[s])
		MOVL(U32(16*s), t)
		VPBROADCASTD(t, cur[s])
		VPADDD(iota, cur[s], cur[s])
	}
	MOVL(U32(16*sets), t)
	step := ZMM()
	VPBROADCASTD(t, step)

	idx = GP64()
	XORQ(idx, idx)
	nv := GP64()
	MOVQ(n, nv)
	ANDQ(I32(-16*sets), nv)
	TESTQ(nv, nv)
	JE(LabelRef("argmax_rest"))
	Label("argmax_loop")
	for s := range sets {
		VMOVUPS(Mem{Base: x, Index: idx, Scale: 4, Disp: 64 * s}, v[s])
		VCMPPS(U8(cmpGT), m[s], v[s], k[s])
		VMOVAPS(v[s], k[s], m[s])
		VMOVDQA32(cur[s], k[s], at[s])
		VPADDD(step, cur[s], cur[s])
	}
	ADDQ(U32(16*sets), idx)
	CMPQ(idx, nv)
	JL(LabelRef("argmax_loop"))

	// The remaining full steps of 16 go to the first set and the masked
	// tail to the second, with their indices made from idx.
	Label("argmax_rest")
	MOVQ(n, nv)
	SUBQ(idx, nv)
	CMPQ(nv, U32(16))
	JL(LabelRef("argmax_tail"))
	VPBROADCASTD(idx.As32(), cur[0])
	VPADDD(iota, cur[0], cur[0])
	VMOVUPS(Mem{Base: x, Index: idx, Scale: 4}, v[0])
	VCMPPS(U8(cmpGT), m[0], v[0], k[0])
	VMOVAPS(v[0], k[0], m[0])
	VMOVDQA32(cur[0], k[0], at[0])
	ADDQ(U32(16), idx)
	JMP(LabelRef("argmax_rest"))

	Label("argmax_tail")
	CMPQ(idx, n)
	JE(LabelRef("argmax_done"))
	mask := tailMask(n)
	VPBROADCASTD(idx.As32(), cur[1])
	VPADDD(iota, cur[1], cur[1])
	VMOVUPS_Z(Mem{Base: x, Index: idx, Scale: 4}, mask, v[1])
	VCMPPS(U8(cmpGT), m[1], v[1], k[1])
	KANDW(mask, k[1], k[1])
	VMOVAPS(v[1], k[1], m[1])
	VMOVDQA32(cur[1], k[1], at[1])

	Label("argmax_done")
	// Reduce the sets lane by lane into the first, then its 16 lanes by
	// halves, each time keeping the greater value or, on a tie, the lower
	// index; lane 0 ends with the answer.
	for d := 1; d < sets; d *= 2 {
		for s := 0; s+d < sets; s += 2 * d {
			argMaxMerge(m[s], at[s], m[s+d], at[s+d])
		}
	}
	for _, sh := range []struct {
		lanes bool // VSHUFF32X4 over 128-bit lanes, else VPSHUFD within them
		imm   uint8
	}{{true, 0x4e}, {true, 0xb1}, {false, 0x4e}, {false, 0xb1}} {
		if sh.lanes {
			VSHUFF32X4(U8(sh.imm), m[0], m[0], m[1])
			VSHUFF32X4(U8(sh.imm), at[0], at[0], at[1])
		} else {
			VPSHUFD(U8(sh.imm), m[0], m[1])
			VPSHUFD(U8(sh.imm), at[0], at[1])
		}
		argMaxMerge(m[0], at[0], m[1], at[1])
	}
	r := GP32()
	VMOVD(at[0].AsX(), r)
	Store(r.As64(), ReturnIndex(0))
	VZEROUPPER()
	RET()
}

// argMaxMerge sets each lane of (m, at) to that of (m2, at2) where m2 is
// greater, or equal with a lower index.
func argMaxMerge(m, at, m2, at2 VecVirtual) {
	gt, eq, k := K(), K(), K()
	VCMPPS(U8(cmpGT), m, m2, gt)
	VCMPPS(U8(0), m, m2, eq)       // EQ_OQ
	VPCMPD(U8(1), at, at2, eq, eq) // at2 < at, where equal
	KORW(gt, eq, k)
	VMOVAPS(m2, k, m)
	VMOVDQA32(at2, k, at)
}

// appendAbove512 emits a scan that writes the indices i of x[:n] with
// x[i] > t, in increasing order, to dst and returns how many. A full step
// compresses the passing lanes' indices in a register and stores all 16
// (dst needs room for n entries: the store at the count never reaches past
// the step's own indices); the tail compresses straight to memory, writing
// only the passing lanes. Compressing in a register and storing whole
// vectors avoids the store form in the loop, which is slow on Zen 4.
func appendAbove512(iota Mem) {
	TEXT("appendAboveAVX512", NOSPLIT, "func(x *float32, n int, t float32, dst *int32) int")
	Doc("appendAboveAVX512 writes the indices i < n with x[i] > t to dst in increasing order and returns their number.")
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	dst := Load(Param("dst"), GP64())
	tv := ZMM()
	VBROADCASTSS(NewParamAddr("t", 16), tv)
	cur := ZMM()
	VMOVDQU32(iota, cur)
	step := ZMM()
	s := GP32()
	MOVL(U32(16), s)
	VPBROADCASTD(s, step)
	cnt := GP64()
	XORQ(cnt, cnt)
	idx = GP64()
	XORQ(idx, idx)
	nv := GP64()
	MOVQ(n, nv)
	ANDQ(I32(-16), nv)
	v, c := ZMM(), ZMM()
	k := K()
	bits := GP32()
	TESTQ(nv, nv)
	JE(LabelRef("above_tail"))
	Label("above_loop")
	VMOVUPS(Mem{Base: x, Index: idx, Scale: 4}, v)
	VCMPPS(U8(cmpGT), tv, v, k)
	VPCOMPRESSD_Z(cur, k, c)
	VMOVDQU32(c, Mem{Base: dst, Index: cnt, Scale: 4})
	KMOVW(k, bits)
	POPCNTL(bits, bits)
	ADDQ(bits.As64(), cnt)
	VPADDD(step, cur, cur)
	ADDQ(U32(16), idx)
	CMPQ(idx, nv)
	JL(LabelRef("above_loop"))

	Label("above_tail")
	CMPQ(idx, n)
	JE(LabelRef("above_done"))
	mask := tailMask(n)
	VMOVUPS_Z(Mem{Base: x, Index: idx, Scale: 4}, mask, v)
	VCMPPS(U8(cmpGT), tv, v, k)
	KANDW(mask, k, k)
	VPCOMPRESSD(cur, k, Mem{Base: dst, Index: cnt, Scale: 4})
	KMOVW(k, bits)
	POPCNTL(bits, bits)
	ADDQ(bits.As64(), cnt)

	Label("above_done")
	Store(cnt, ReturnIndex(0))
	VZEROUPPER()
	RET()
}
