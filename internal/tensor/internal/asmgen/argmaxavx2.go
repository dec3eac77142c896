package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// argMaxAVX2 emits argMax512's scan with 8-lane vectors and blends in place
// of mask registers: two sets of 8 lanes keep, per lane, the largest entry
// seen and the index where it was first seen (an entry replaces the lane's
// only if it is greater, so NaN never does and ties keep the first); the
// sets take turns at steps of 8, are merged lane by lane and then across
// lanes, each time keeping the greater value or, on a tie, the lower index.
// The n%8 tail is scanned one entry at a time after that: its indices are
// above every vector lane's, so only a greater entry replaces the answer.
// Lanes start at -Inf with index 0, which is the answer when nothing is
// above -Inf. Attention's online softmax takes one per row and key chunk.
func argMaxAVX2(iota Mem) {
	TEXT("argMaxAVX2", NOSPLIT, "func(x *float32, n int) int")
	Doc("argMaxAVX2 returns the index of the largest entry of x[:n], the lowest on ties; NaN never wins; 0 if nothing is above -Inf.")
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	neg := GP32()
	MOVL(U32(0xff800000), neg)
	var m, at, cur [2]VecVirtual
	t := GP32()
	for s := range 2 {
		m[s], at[s], cur[s] = YMM(), YMM(), YMM()
		VMOVD(neg, m[s].AsX())
		VPBROADCASTD(m[s].AsX(), m[s])
		VPXOR(at[s], at[s], at[s])
		VMOVDQU(iota, cur[s])
		if s > 0 {
			MOVL(U32(8*s), t)
			st := YMM()
			VMOVD(t, st.AsX())
			VPBROADCASTD(st.AsX(), st)
			VPADDD(st, cur[s], cur[s])
		}
	}
	step := YMM()
	MOVL(U32(16), t)
	VMOVD(t, step.AsX())
	VPBROADCASTD(step.AsX(), step)
	// scan lets entries at x[idx+8s:] replace set s's lanes (cur: their
	// indices).
	scan := func(s int, mem Mem) {
		v, gt := YMM(), YMM()
		VMOVUPS(mem, v)
		VCMPPS(U8(cmpGT), m[s], v, gt) // v > m
		VBLENDVPS(gt, v, m[s], m[s])
		VBLENDVPS(gt, cur[s], at[s], at[s])
	}

	idx = GP64()
	XORQ(idx, idx)
	nv := GP64()
	MOVQ(n, nv)
	ANDQ(I32(-16), nv)
	TESTQ(nv, nv)
	JE(LabelRef("argmax_rest"))
	Label("argmax_loop")
	for s := range 2 {
		scan(s, Mem{Base: x, Index: idx, Scale: 4, Disp: 32 * s})
		VPADDD(step, cur[s], cur[s])
	}
	ADDQ(U32(16), idx)
	CMPQ(idx, nv)
	JL(LabelRef("argmax_loop"))

	// One remaining full step of 8 goes to the first set, its indices made
	// from idx.
	Label("argmax_rest")
	MOVQ(n, nv)
	SUBQ(idx, nv)
	CMPQ(nv, U32(8))
	JL(LabelRef("argmax_merge"))
	VMOVD(idx.As32(), cur[0].AsX())
	VPBROADCASTD(cur[0].AsX(), cur[0])
	VPADDD(iota, cur[0], cur[0])
	scan(0, Mem{Base: x, Index: idx, Scale: 4})
	ADDQ(U32(8), idx)

	Label("argmax_merge")
	argMaxMergeAVX2(m[0], at[0], m[1], at[1])
	VPERM2F128(U8(0x01), m[0], m[0], m[1])
	VPERM2F128(U8(0x01), at[0], at[0], at[1])
	argMaxMergeAVX2(m[0], at[0], m[1], at[1])
	for _, imm := range []uint8{0x4e, 0xb1} {
		VPSHUFD(U8(imm), m[0], m[1])
		VPSHUFD(U8(imm), at[0], at[1])
		argMaxMergeAVX2(m[0], at[0], m[1], at[1])
	}
	r := GP32()
	VMOVD(at[0].AsX(), r)
	best := m[0].AsX()

	Label("argmax_tail")
	CMPQ(idx, n)
	JE(LabelRef("argmax_done"))
	e := XMM()
	VMOVSS(Mem{Base: x, Index: idx, Scale: 4}, e)
	VUCOMISS(best, e) // e > best: CF = ZF = 0 (unordered sets both)
	JBE(LabelRef("argmax_next"))
	VMOVAPS(e, best)
	MOVL(idx.As32(), r)
	Label("argmax_next")
	INCQ(idx)
	JMP(LabelRef("argmax_tail"))

	Label("argmax_done")
	Store(r.As64(), ReturnIndex(0))
	VZEROUPPER()
	RET()
}

// argMaxMergeAVX2 sets each lane of (m, at) to that of (m2, at2) where m2
// is greater, or equal with a lower index.
func argMaxMergeAVX2(m, at, m2, at2 VecVirtual) {
	gt, eq, lo := YMM(), YMM(), YMM()
	VCMPPS(U8(cmpGT), m, m2, gt) // m2 > m
	VCMPPS(U8(0), m, m2, eq)     // EQ_OQ
	VPCMPGTD(at2, at, lo)        // at > at2
	VPAND(lo, eq, eq)
	VPOR(gt, eq, gt)
	VBLENDVPS(gt, m2, m, m)
	VBLENDVPS(gt, at2, at, at)
}
