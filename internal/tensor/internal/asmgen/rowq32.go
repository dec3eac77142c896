package main

// The row kernel of the 32-weight blocks (Q8_0, Q4_0, Q5_0), AVX-512 and
// AVX2: phase 1 per group of 8 blocks, phase 2 as vector chains of 8 rows
// (see rowquant.go).

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// row32 emits the row kernel of Q8_0, Q4_0 or Q5_0 (q.bytes 34, 18, 22):
// per block a vector of 32 level bytes made from the block (Q8_0 with
// AVX-512: the levels + 128, as the panel kernels do; Q8_0 with AVX2: the
// raw signed levels, for the sign trick; Q4_0 the nibbles; Q5_0 the
// nibbles with their fifth bits), its dot product with the activation
// block in 8 dword lanes (VPDPBUSD, or VPMADDUBSW and VPMADDWD by ones on
// AVX2), the correction of the unsigned levels (−128·Σx, −8·Σx, −16·Σx,
// from aux) added after the tree.
func row32(avx512 bool, q quant32) {
	k := &rowKern{avx512: avx512, group: 8, pairs: 1, transposed: true}
	k.setStreams(rowStreamsAVX2)
	name := "qrow" + q.name + k.isaName()
	TEXT(name, NOSPLIT, k.sig())
	Doc(fmt.Sprintf("%s computes up to 8 %s weight rows times one activation row (see asmgen's rowquant.go).", name, q.name))
	var c80, ones, c0f, shift, qhSpread, bits, c10 VecVirtual
	signed := q.bytes == 34 && !avx512
	if q.bytes == 34 && avx512 {
		c80 = k.splatY(0x80808080)
	}
	if !avx512 {
		ones = k.splatY(0x00010001)
	}
	if q.bytes != 34 {
		// Low nibbles to bytes 0..15, high ones to 16..31.
		c0f = k.splatY(0x0f0f0f0f)
		shift = YMM()
		k.movdqu(table("shr0x4x4", []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
			4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0}), shift)
	}
	if q.bytes == 22 {
		// Bit t of qh to bit 4 of byte t: byte t/8 of qh spread to the 8
		// bytes 8(t/8).., tested against 1 << t%8.
		var sp, bt []byte
		for t := range 32 {
			sp = append(sp, byte(t/8))
			bt = append(bt, byte(1<<(t%8)))
		}
		qhSpread = YMM()
		k.movdqu(table("q5spreadb", sp), qhSpread)
		bits = YMM()
		k.movdqu(table("q5bits", bt), bits)
		c10 = k.splatY(0x10101010)
	}
	k.phase1(32, q.bytes, func(wq, xq, b, slot GPVirtual) {
		p := make([]VecVirtual, 8)
		for t := range 8 {
			blk := func(d int) Mem { return Mem{Base: wq, Disp: q.bytes*t + d} }
			xm := Mem{Base: xq, Disp: 32 * t}
			if avx512 {
				p[t] = ymmZero() // VPDPBUSD adds to it
			} else {
				p[t] = YMM() // VPMADDWD writes it whole
			}
			if signed {
				// The sign trick: |w|·(x·sign w), pairs exact in int16
				// (at most 2·128·127). The weights are loaded once: a
				// block is 34 bytes, so half its loads cross a line.
				wv, av, xs := YMM(), YMM(), YMM()
				VMOVDQU(blk(2), wv)
				VPABSB(wv, av)
				VMOVDQU(xm, xs)
				VPSIGNB(wv, xs, xs)
				VPMADDUBSW(xs, av, xs)
				VPMADDWD(ones, xs, p[t])
				continue
			}
			v := YMM()
			switch q.bytes {
			case 34:
				VPXORD(blk(2), c80, v)
			default:
				qs := 2
				if q.bytes == 22 {
					qs = 6
				}
				k.bcast128(blk(qs), v)
				VPSRLVD(shift, v, v)
				k.and(c0f, v, v)
				if q.bytes == 22 {
					h := YMM()
					VPBROADCASTD(blk(2), h)
					VPSHUFB(qhSpread, h, h)
					if avx512 {
						km := K()
						VPTESTMB(bits, h, km)
						VPADDB(c10, v, km, v)
					} else {
						VPAND(bits, h, h)
						VPCMPEQB(bits, h, h)
						VPAND(c10, h, h)
						VPOR(h, v, v)
					}
				}
			}
			if avx512 {
				vpdpbusd(xm, v, p[t], false)
			} else {
				VPMADDUBSW(xm, v, v)
				VPMADDWD(ones, v, p[t])
			}
		}
		c := k.tree8(p)
		if !signed {
			corr := k.param("aux")
			LEAQ(Mem{Base: corr, Index: k.nb, Scale: 4}, corr)
			VPADDD(Mem{Base: corr, Index: b, Scale: 4}, c, c)
		}
		f := YMM()
		VCVTDQ2PS(c, f)
		VMOVUPS(f, Mem{Base: slot})
		g := k.halves8(wq, 0, q.bytes)
		VMULPS(Mem{Base: k.param("aux"), Index: b, Scale: 4}, g, g)
		VMOVUPS(g, Mem{Base: slot, Disp: 32})
	})
	k.phase2vec()
	VZEROUPPER()
	RET()
}

// halves8 returns the 8 f16 at disp + stride·t (t < 8) from base,
// widened to f32: loaded into two GP registers, four each, moved over (a
// gather costs ~12 cycles on Zen 4, the GP loads run on otherwise idle
// ports).
func (k rowKern) halves8(base GPVirtual, disp, stride int) VecVirtual {
	lo, hi := pack4x16(base, disp, stride), pack4x16(base, disp+4*stride, stride)
	x := XMM()
	VMOVQ(lo, x)
	VPINSRQ(U8(1), hi, x, x)
	f := YMM()
	VCVTPH2PS(x, f)
	return f
}
