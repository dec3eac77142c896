package main

// The AVX2 panel kernels of the 32-weight blocks (Q8_0, Q4_0, Q5_0): the
// pack kernel and the dot kernel.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// pack32AVX2 emits the AVX2 pack kernel of Q8_0 (raw signed levels), Q4_0
// (nibbles) or Q5_0 (nibbles and fifth bits).
func pack32AVX2(q quant32) {
	name := "qpack" + q.name + "AVX2"
	TEXT(name, NOSPLIT, packSig)
	Doc(fmt.Sprintf("%s packs nb %s blocks of 8 weight rows ldw bytes apart into a panel at dst and prefetches as many bytes from pf (see asmgen).", name, q.name))
	w, L, nb, dst, pf := packArgs()
	r := newRows8(w, L)
	idx := rowIndex8(L)
	ones := splat8(0xffffffff)
	lo16 := splat8(0xffff)
	c0f := splat8(0x0f0f0f0f)
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	prefetchNext(pf, 8*q.bytes, false)
	switch q.bytes {
	case 34:
		for i, v := range transpose8x8(r, 2) {
			VMOVDQU(v, Mem{Base: dst, Disp: 32 * i})
		}
	case 22:
		// Q5_0: the fifth bits spread to bit 4 of each byte by a
		// multiplication (bit k of a nibble lands in byte k).
		mask := YMM()
		VMOVDQA(ones, mask)
		qh := YMM()
		VXORPS(qh, qh, qh)
		VPGATHERDD(mask, Mem{Base: r.bases[0], Index: idx, Scale: 1, Disp: 2}, qh)
		for i, v := range transpose8x4(r, 6) {
			hi := YMM()
			VPSRLD(U8(4), v, hi)
			VPAND(c0f, v, v)
			VPAND(c0f, hi, hi)
			for h, lv := range []VecVirtual{v, hi} {
				b := YMM()
				VPSRLD(U8(16*h+4*i), qh, b)
				VPAND(splat8(15), b, b)
				VPMULLD(splat8(0x00204081), b, b)
				VPAND(splat8(0x01010101), b, b)
				VPSLLD(U8(4), b, b)
				VPOR(b, lv, lv)
			}
			VMOVDQU(v, Mem{Base: dst, Disp: 32 * i})
			VMOVDQU(hi, Mem{Base: dst, Disp: 32 * (4 + i)})
		}
	default:
		for i, v := range transpose8x4(r, 2) {
			hi := YMM()
			VPSRLD(U8(4), v, hi)
			VPAND(c0f, v, v)
			VPAND(c0f, hi, hi)
			VMOVDQU(v, Mem{Base: dst, Disp: 32 * i})
			VMOVDQU(hi, Mem{Base: dst, Disp: 32 * (4 + i)})
		}
	}
	VMOVUPS(gatherF16x8(r, idx, ones, lo16, 0, false), Mem{Base: dst, Disp: 256})
	r.advance(q.bytes)
	ADDQ(U32(panel32Bytes8), dst)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// dot32AVX2 emits the AVX2 dot kernel of 32-weight blocks: Q8_0 panels
// (signed levels, sign trick, no correction) for maxLevel 0, or Q4_0/Q5_0
// ones (unsigned levels ≤ maxLevel, 15 or 31, the correction from the
// metadata): a group of VPMADDUBSW results (see int16Group) is summed in
// int16 (VPADDW) before one VPMADDWD by ones widens it. Q8_0's pair sums
// reach 32,512, so each is widened alone.
func dot32AVX2(rows, maxLevel int) {
	name := fmt.Sprintf("qdotQ8_0AVX2R%d", rows)
	switch maxLevel {
	case 15:
		name = fmt.Sprintf("qdotQ4_0AVX2R%d", rows)
	case 31:
		name = fmt.Sprintf("qdotQ5_0AVX2R%d", rows)
	}
	unsigned := maxLevel > 0
	group := 1
	if unsigned {
		group = int16Group(maxLevel, 8)
	}
	TEXT(name, NOSPLIT, dotSig)
	Doc(fmt.Sprintf("%s continues the 8-lane f32 chains of %d activation rows over nb blocks of a panel (see asmgen).", name, rows))
	x, m, panel, nb, accp := dotArgs(rows)
	ones16 := splat8(0x00010001)
	acc := make([]VecVirtual, rows)
	for r := range acc {
		acc[r] = YMM()
		VMOVUPS(Mem{Base: accp, Disp: 32 * r}, acc[r])
	}
	TESTQ(nb, nb)
	JE(LabelRef("store"))
	Label("block")
	is := make([]VecVirtual, rows)
	for r := range is {
		is[r] = YMM()
		if unsigned {
			VPBROADCASTD(m.at(r, 4), is[r])
		} else {
			VXORPS(is[r], is[r], is[r])
		}
	}
	for g0 := 0; g0 < 8; g0 += group {
		s16 := make([]VecVirtual, rows)
		for t := g0; t < g0+group; t++ {
			v := YMM()
			VMOVDQU(Mem{Base: panel, Disp: 32 * t}, v)
			var av VecVirtual
			if !unsigned {
				av = YMM()
				VPABSB(v, av)
			}
			for r := range rows {
				xb := YMM()
				VPBROADCASTD(x.at(r, 4*t), xb)
				if unsigned {
					VPMADDUBSW(xb, v, xb)
				} else {
					VPSIGNB(v, xb, xb)
					VPMADDUBSW(xb, av, xb)
				}
				if t == g0 {
					s16[r] = xb
					continue
				}
				VPADDW(xb, s16[r], s16[r])
			}
		}
		for r := range rows {
			VPMADDWD(ones16, s16[r], s16[r])
			VPADDD(s16[r], is[r], is[r])
		}
	}
	dw := YMM()
	VMOVUPS(Mem{Base: panel, Disp: 256}, dw)
	for r := range rows {
		s := YMM()
		VBROADCASTSS(m.at(r, 0), s)
		VMULPS(dw, s, s)
		f := YMM()
		VCVTDQ2PS(is[r], f)
		VFMADD231PS(s, f, acc[r])
	}
	x.advance(32)
	m.advance(8)
	ADDQ(U32(panel32Bytes8), panel)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("store")
	for r := range acc {
		VMOVUPS(acc[r], Mem{Base: accp, Disp: 32 * r})
	}
	VZEROUPPER()
	RET()
}
