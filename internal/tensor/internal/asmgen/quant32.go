package main

// The AVX-512 panel kernels of the 32-weight blocks (Q8_0, Q4_0, Q5_0): the
// panel layout, the pack kernel and the dot kernel.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// spreadTable emits (once) the table whose entry v (v < 16) has bit k of
// v at bit 4 of byte k: the fifth bits of four Q5_0 levels.
func spreadTable() Mem {
	if spreadMem != nil {
		return *spreadMem
	}
	t := GLOBL("q5spread", RODATA|NOPTR)
	spreadMem = &t
	for v := range 16 {
		var e uint32
		for k := range 4 {
			e |= uint32(v>>k&1) << (8*k + 4)
		}
		DATA(4*v, U32(e))
	}
	return t
}

var spreadMem *Mem

// Panel layout of the 32-weight blocks: per block 8 vectors of levels
// (vector t: levels 4t..4t+3 of every row, unsigned) and the 16 scales.
const (
	panel32Vecs  = 9
	panel32Bytes = 64 * panel32Vecs
)

// pack32 emits the pack kernel of Q8_0 (levels + 128), Q4_0 (the nibbles)
// or Q5_0 (nibbles and fifth bits): nb blocks of 16 rows ldw bytes apart
// into dst.
func pack32(q quant32) {
	name := "qpack" + q.name + "AVX512"
	TEXT(name, NOSPLIT, packSig)
	Doc(fmt.Sprintf("%s packs nb %s blocks of 16 weight rows ldw bytes apart into a panel at dst and prefetches as many bytes from pf (see asmgen).", name, q.name))
	w := Load(Param("w"), GP64()).(GPVirtual)
	L := Load(Param("ldw"), GP64()).(GPVirtual)
	nb := Load(Param("nb"), GP64())
	dst := Load(Param("dst"), GP64())
	pf := Load(Param("pf"), GP64()).(GPVirtual)
	r := newRows16(w, L)
	idx := rowIndex(L)
	var c VecVirtual
	if q.bytes == 34 {
		c = splat(0x80808080)
	} else {
		c = splat(0x0f0f0f0f)
	}
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	prefetchNext(pf, 16*q.bytes, true)
	switch q.bytes {
	case 34:
		t := transpose16x8(r, 2)
		for i, v := range t {
			VPXORD(c, v, v)
			VMOVDQU64(v, Mem{Base: dst, Disp: 64 * i})
		}
	case 22:
		// Q5_0: nibbles at 6, the 32 fifth bits at 2.
		qh := gatherD(r, idx, 2)
		for i, v := range transpose16x4(r, 6) {
			hi := ZMM()
			VPSRLD(U8(4), v, hi)
			VPANDD(c, v, v)
			VPANDD(c, hi, hi)
			for h, lv := range []VecVirtual{v, hi} {
				b := shifted(qh, -(16*h + 4*i))
				if b == qh {
					b = ZMM()
					VMOVDQA64(qh, b)
				}
				VPERMD(spreadTable(), b, b)
				VPORD(b, lv, lv)
			}
			VMOVDQU64(v, Mem{Base: dst, Disp: 64 * i})
			VMOVDQU64(hi, Mem{Base: dst, Disp: 64 * (4 + i)})
		}
	default:
		t := transpose16x4(r, 2)
		for i, v := range t {
			hi := ZMM()
			VPSRLD(U8(4), v, hi)
			VPANDD(c, v, v)
			VPANDD(c, hi, hi)
			VMOVDQU64(v, Mem{Base: dst, Disp: 64 * i})
			VMOVDQU64(hi, Mem{Base: dst, Disp: 64 * (4 + i)})
		}
	}
	VMOVUPS(gatherF16(r, idx, 0, false), Mem{Base: dst, Disp: 512})
	r.advance(q.bytes)
	ADDQ(U32(panel32Bytes), dst)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// maxDot32Rows is the largest number of activation rows one dot32 kernel
// takes.
const maxDot32Rows = 8

// dot32 emits the dot kernel for rows activation rows and panels of
// 32-weight blocks: for each block b, for each row r, I = corr_rb + Σ
// VPDPBUSD(levels, x bytes), acc_r = fma(float(I), scales·dx_rb, acc_r).
// acc holds rows×16 f32 chains (row r at acc+64r), loaded and stored.
func dot32(rows int) {
	name := fmt.Sprintf("qdot32AVX512R%d", rows)
	TEXT(name, NOSPLIT, dotSig)
	Doc(fmt.Sprintf("%s continues the 16-lane f32 chains of %d activation rows over nb blocks of a Q8_0/Q4_0 panel (see asmgen).", name, rows))
	x, m, panel, nb, accp := dotArgs(rows)
	acc := make([]VecVirtual, rows)
	for r := range acc {
		acc[r] = ZMM()
		VMOVUPS(Mem{Base: accp, Disp: 64 * r}, acc[r])
	}
	TESTQ(nb, nb)
	JE(LabelRef("store"))
	Label("block")
	is := make([]VecVirtual, rows)
	for r := range is {
		is[r] = ZMM()
		VPBROADCASTD(m.at(r, 4), is[r])
	}
	for t := range 8 {
		v := ZMM()
		VMOVDQU64(Mem{Base: panel, Disp: 64 * t}, v)
		for r := range rows {
			vpdpbusd(x.at(r, 4*t), v, is[r], true)
		}
	}
	dw := ZMM()
	VMOVUPS(Mem{Base: panel, Disp: 512}, dw)
	for r := range rows {
		s := ZMM()
		VMULPS_BCST(m.at(r, 0), dw, s)
		f := ZMM()
		VCVTDQ2PS(is[r], f)
		VFMADD231PS(s, f, acc[r])
	}
	x.advance(32)
	m.advance(8)
	ADDQ(U32(panel32Bytes), panel)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("store")
	for r := range acc {
		VMOVUPS(acc[r], Mem{Base: accp, Disp: 64 * r})
	}
	VZEROUPPER()
	RET()
}
