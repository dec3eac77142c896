package main

// The Q6_K row kernel rowQ6K (emitted for AVX2; the AVX-512 one is
// rowQ6K512, in rowk512.go) and its super-block dot product q6kSuper with
// the constants it needs, which row8Q6KAVX2 (row8.go) shares.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// q6kConsts8 is q6kConsts with the masks in memory.
func (k rowKern) q6kConsts8() q6kConst {
	var m []byte
	for range 32 {
		m = append(m, 0x0f)
	}
	var h []byte
	for range 32 {
		h = append(h, 0x30)
	}
	c := q6kConst{c0f: table("rowc0f", m), c30: table("rowc30", h)}
	c.evenOdd, c.scCtrl = k.q6kTables()
	return c
}

// rowQ6K emits the Q6_K row kernel. The levels (4 low bits from ql, 2
// high from qh, unsigned 0..63) times the activations by VPMADDUBSW;
// per 32 levels (two sub-blocks of 16, one per 128-bit half) times the
// two sub-block scales by VPDPWSSD (VPMADDWD and VPADDD on AVX2) with the
// scales spread by VPSHUFB from a vector holding the even scales in its
// low half and the odd ones in its high half; the offset 32 of the levels
// is taken off as 32·Σ scale·(Σx per 16) by VPMADDWD.
func rowQ6K(avx512 bool) {
	k := &rowKern{avx512: avx512, group: 4, pairs: 1}
	k.setStreams(rowStreamsKAVX2)
	const bytes = 210
	name := "qrowQ6_K" + k.isaName()
	TEXT(name, NOSPLIT, k.sig())
	Doc(fmt.Sprintf("%s computes up to 8 Q6_K weight rows times one activation row (see asmgen's rowquant.go).", name))
	c := k.q6kConsts()
	k.phase1(256, bytes, func(wq, xq, b, slot GPVirtual) {
		mq := GP64()
		MOVQ(b, mq)
		SHLQ(U8(6), mq)
		ADDQ(paramMem("meta"), mq)
		z := make([]VecVirtual, 4)
		for t := range 4 {
			blk := func(d int) Mem { return Mem{Base: wq, Disp: bytes*t + d} }
			xm := func(d int) Mem { return Mem{Base: xq, Disp: 256*t + d} }
			z[t] = k.q6kSuper(c, blk, xm, Mem{Base: mq, Disp: 64*t + metaSums16})
		}
		r := k.tree4x2(z)
		ix := k.extractHi(r)
		VPADDD(r.AsX(), ix, ix)
		f := XMM()
		VCVTDQ2PS(ix, f)
		VMOVUPS(f, Mem{Base: slot})
		q := pack4x16(wq, 208, bytes)
		x := XMM()
		VMOVQ(q, x)
		VCVTPH2PS(x, x)
		VMULPS(Mem{Base: k.param("aux"), Index: b, Scale: 4}, x, x)
		VMOVUPS(x, Mem{Base: slot, Disp: 16})
	})
	k.phase2()
	VZEROUPPER()
	RET()
}

// q6kConst holds the constants of the Q6_K row kernels' super-block.
type q6kConst struct {
	// c0f and c30: the masks, in registers or memory.
	c0f, c30        Op
	evenOdd, scCtrl Mem
}

// q6kConsts emits the constants of q6kSuper.
func (k rowKern) q6kConsts() q6kConst {
	var c q6kConst
	c.c0f = k.splatY(0x0f0f0f0f)
	c.c30 = k.splatY(0x30303030)
	c.evenOdd, c.scCtrl = k.q6kTables()
	return c
}

// q6kTables returns the byte tables of q6kSuper: the even then the odd
// bytes of 16, and the spread of the 16 scales over the quarters.
func (k rowKern) q6kTables() (evenOdd, scCtrl Mem) {
	var eo []byte
	for i := range 8 {
		eo = append(eo, byte(2*i))
	}
	for i := range 8 {
		eo = append(eo, byte(2*i+1))
	}
	var ctrl []byte
	for w := range 8 {
		for range 2 {
			for range 8 {
				ctrl = append(ctrl, byte(2*w), byte(2*w+1))
			}
		}
	}
	return table("q6evenodd", eo), table("q6scspread", ctrl)
}

// q6kSuper emits one Q6_K super-block's dot product with the activations
// (blk: the block's bytes, xm: its 256 activation levels, sums16: their
// sums per 16 in the metadata) as 8 dword partial sums: their total is
// the exact integer Σ scale·(Σ level·x) − 32·Σ scale·(Σx per 16).
func (k rowKern) q6kSuper(c q6kConst, blk, xm func(int) Mem, sums16 Mem) VecVirtual {
	sx := XMM()
	VMOVDQU(blk(192), sx)
	// The offset: 32·Σ scale·(Σx per 16).
	sn := YMM()
	VPMOVSXBW(sx, sn)
	off := YMM()
	VPMADDWD(sums16, sn, off)
	VPSHUFB(c.evenOdd, sx, sx)
	d := YMM()
	VPMOVSXBW(sx, d)
	// Two chains of sums, each started by its first product.
	var acc [2]VecVirtual
	for h := range 2 {
		ql := [2]VecVirtual{YMM(), YMM()}
		VMOVDQU(blk(64*h), ql[0])
		VMOVDQU(blk(64*h+32), ql[1])
		qh := YMM()
		VMOVDQU(blk(128+32*h), qh)
		for q := range 4 {
			// Quarter q: low nibbles of ql[q%2] (q < 2) or high
			// ones, bits 2q, 2q+1 of qh at 4, 5.
			hb := YMM()
			switch n := 4 - 2*q; {
			case n > 0:
				VPSLLW(U8(n), qh, hb)
				k.and(c.c30, hb, hb)
			case n < 0:
				VPSRLW(U8(-n), qh, hb)
				k.and(c.c30, hb, hb)
			default:
				k.and(c.c30, qh, hb)
			}
			lv := YMM()
			if q < 2 {
				k.and(c.c0f, ql[q], lv)
			} else {
				VPSRLW(U8(4), ql[q-2], lv)
				k.and(c.c0f, lv, lv)
			}
			if k.avx512 {
				VPORD(hb, lv, lv)
			} else {
				VPOR(hb, lv, lv)
			}
			p := YMM()
			VPMADDUBSW(xm(128*h+32*q), lv, p)
			sq := YMM()
			VPSHUFB(c.scCtrl.Offset(32*(4*h+q)), d, sq)
			if h == 0 && q < 2 {
				acc[q] = YMM()
				VPMADDWD(sq, p, acc[q])
			} else {
				k.pairDot(sq, false, p, acc[q%2])
			}
		}
	}
	VPADDD(acc[1], acc[0], acc[0])
	VPSLLD(U8(5), off, off)
	VPSUBD(off, acc[0], acc[0])
	return acc[0]
}
