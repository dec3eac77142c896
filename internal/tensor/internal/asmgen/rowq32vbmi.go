package main

// The AVX512-VBMI row kernels of Q4_0 and Q5_0 (see rowquant.go for the
// two phases they share with every row kernel).

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// row32VBMI emits qrowQ4_0VBMI (Q5_0 with five): row32's kernel with the
// byte permutes of AVX512-VBMI, four blocks per 512-bit vector. row32
// builds one 256-bit vector of levels per block (a 16-byte broadcast, a
// shift per half, a mask) and reduces the 8 blocks' vectors of 8 partial
// sums by a tree of 23 shuffles and adds: about 100 instructions per group
// of 8 blocks, which held it at 19–21 GB/s on L2-resident weights on a
// Zen 4, below what one core reads from DRAM (27–31 GB/s). Here the group's
// 144 (176) bytes load as three 512-bit vectors, one VPERMI2B/VPERMT2B per
// four blocks gathers their 16 nibble bytes into the four 128-bit
// quarters, and the low and the high nibbles of a quarter go to one
// VPDPBUSD each, against the activations of the weights 0..15 and 16..31
// of its block: package tensor's qAct.rowX lays them out so (per four
// blocks, the 16-byte halves of the blocks' activations: first halves
// 0..3, then second halves 0..3), which needs the row's block count a
// multiple of 4 (groups start at multiples of 4). Both nibbles' sums of a
// block add up in the same 4 dword lanes, so the reduction of a group is
// 6 instructions; the 8 f16 scales come in one word permute of the loaded
// bytes instead of 8 scalar loads. Q5_0's fifth bits are byte permutes of
// its qh words tested against the bit of each weight (VPTESTMB) and added
// as 16 under that mask. The integers and the chains are row32's, so the
// results are bit-identical to it.
func row32VBMI(five bool) {
	k := &rowKern{avx512: true, group: 8, pairs: 1, transposed: true}
	nm, bytes, qs := "Q4_0", 18, 2
	if five {
		nm, bytes, qs = "Q5_0", 22, 6
	}
	name := "qrow" + nm + "VBMI"
	TEXT(name, NOSPLIT, k.sig())
	Doc(fmt.Sprintf("%s computes up to 8 %s weight rows times one activation row (activations in qAct.rowX's order, blocks a multiple of 4; see asmgen's rowq32vbmi.go).", name, nm))
	c0f := splat(0x0f0f0f0f)
	// The group's bytes in three vectors: v0 = bytes 0..63, v1 = 64..127
	// and, for blocks 4..7, a vector ending at the group's end (mem
	// operand): blocks 0..3 permute from (v0, v1), blocks 4..7 from (v1,
	// tail).
	tailOff := 8*bytes - 64
	// src returns the permute index of group byte o for the tables at
	// group bytes base and base2 (bit 6 selects the second).
	src := func(o, base, base2 int) byte {
		switch {
		case o >= base && o < base+64:
			return byte(o - base)
		case o >= base2 && o < base2+64:
			return byte(64 + o - base2)
		}
		panic(fmt.Sprintf("%s: byte %d outside the tables at %d and %d", name, o, base, base2))
	}
	// Byte i of quarter q of the permute of blocks 4h..4h+3: the nibble
	// byte i of block 4h+q; of the qh permutes (Q5_0), byte j (of 4) of
	// that block's qh for the bit of weight i (low nibbles) or 16 + i
	// (high ones).
	nibIdx, qhIdx := [2]VecVirtual{}, [2][2]VecVirtual{}
	for h := range 2 {
		b1, b2 := 0, 64 // (v0, v1), then (v1, tail)
		if h == 1 {
			b1, b2 = 64, tailOff
		}
		var ni []byte
		var qi [2][]byte
		for q := range 4 {
			blk := bytes * (4*h + q)
			for i := range 16 {
				ni = append(ni, src(blk+qs+i, b1, b2))
				for hi := range 2 {
					qi[hi] = append(qi[hi], src(blk+2+2*hi+i/8, b1, b2))
				}
			}
		}
		nibIdx[h] = ZMM()
		VMOVDQU64(table(fmt.Sprintf("q%dvbmi%d", bytes, h), ni), nibIdx[h])
		if five {
			for hi := range 2 {
				qhIdx[h][hi] = ZMM()
				VMOVDQU64(table(fmt.Sprintf("q5vbmiqh%d%d", h, hi), qi[hi]), qhIdx[h][hi])
			}
		}
	}
	var bits, c10 VecVirtual
	if five {
		var bt []byte
		for i := range 64 {
			bt = append(bt, byte(1<<(i%8)))
		}
		bits = ZMM()
		VMOVDQU64(table("q5vbmibits", bt), bits)
		c10 = splat(0x10101010)
	}
	// The scale of block t: word bytes·t/2 of the pair (v0, v1), or for
	// Q5_0's blocks 6 and 7 (past byte 127) of the pair (v1, tail).
	var sw, sw2 []byte
	for t := range 32 {
		o := bytes * min(t, 7)
		w0, w1 := 0, 0
		if o+2 <= 128 {
			w0 = o / 2
		}
		if o >= 64 && o+2 <= 64+64 {
			w1 = (o - 64) / 2
		} else if o >= tailOff {
			w1 = 32 + (o-tailOff)/2
		}
		sw = append(sw, byte(w0), 0)
		sw2 = append(sw2, byte(w1), 0)
	}
	scIdx := ZMM()
	VMOVDQU64(table(fmt.Sprintf("q%dvbmisc", bytes), sw), scIdx)
	var scIdx2 VecVirtual
	var late OpmaskVirtual
	if five {
		scIdx2 = ZMM()
		VMOVDQU64(table("q5vbmisc2", sw2), scIdx2)
		late = K()
		g := GP32()
		MOVL(U32(0xc0), g) // words 6 and 7
		KMOVD(g, late)
	}
	// The sums of the four dword lanes of quarter q of the two
	// accumulators are dwords 4q and 4q+2 of the tree's last vector: to
	// block order.
	var gi []byte
	for _, d := range []int{0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0} {
		gi = append(gi, byte(d), 0, 0, 0)
	}
	gather := ZMM()
	VMOVDQU64(table("q32vbmigather", gi), gather)
	k.phase1(32, bytes, func(wq, xq, b, slot GPVirtual) {
		v0, v1 := ZMM(), ZMM()
		VMOVDQU64(Mem{Base: wq}, v0)
		VMOVDQU64(Mem{Base: wq, Disp: 64}, v1)
		tail := Mem{Base: wq, Disp: tailOff}
		// The scales first: the permutes below overwrite their operands.
		sc := ZMM()
		VMOVDQA64(scIdx, sc)
		VPERMI2W(v1, v0, sc)
		if five {
			s2 := ZMM()
			VMOVDQA64(scIdx2, s2)
			VPERMI2W(tail, v1, s2)
			VMOVDQU16(s2, late, sc)
		}
		var acc [2]VecVirtual
		for h := range 2 {
			t1, t2 := Op(v1), Op(tail)
			if h == 0 {
				t1, t2 = v0, v1
			}
			var qh [2]OpmaskVirtual
			if five {
				for hi := range 2 {
					q := ZMM()
					VMOVDQA64(qhIdx[h][hi], q)
					VPERMI2B(t2, t1, q)
					qh[hi] = K()
					VPTESTMB(bits, q, qh[hi])
				}
			}
			n := ZMM()
			if h == 0 {
				VMOVDQA64(nibIdx[h], n)
				VPERMI2B(v1, v0, n)
			} else {
				// The last use of v1: it becomes the result.
				VPERMT2B(tail, nibIdx[h], v1)
				n = v1
			}
			lo, hi := ZMM(), ZMM()
			VPANDD(c0f, n, lo)
			VPSRLW(U8(4), n, hi)
			VPANDD(c0f, hi, hi)
			acc[h] = zmmZero()
			for j, v := range []VecVirtual{lo, hi} {
				if five {
					VPADDB(c10, v, qh[j], v)
				}
				vpdpbusd(Mem{Base: xq, Disp: 128*h + 64*j}, v, acc[h], false)
			}
		}
		// Quarter q: [a0+a2, a1+a3, b0+b2, b1+b3] of acc[0] (a) and
		// acc[1] (b), then each pair summed: dwords 4q and 4q+2.
		u, w := ZMM(), ZMM()
		VPUNPCKLQDQ(acc[1], acc[0], u)
		VPUNPCKHQDQ(acc[1], acc[0], w)
		VPADDD(w, u, u)
		VPSHUFD(U8(0b10_11_00_01), u, w)
		VPADDD(w, u, u)
		c := ZMM()
		VPERMD(u, gather, c)
		corr := k.param("aux")
		LEAQ(Mem{Base: corr, Index: k.nb, Scale: 4}, corr)
		VPADDD(Mem{Base: corr, Index: b, Scale: 4}, c.AsY(), c.AsY())
		f := YMM()
		VCVTDQ2PS(c.AsY(), f)
		VMOVUPS(f, Mem{Base: slot})
		g := YMM()
		VCVTPH2PS(sc.AsX(), g)
		VMULPS(Mem{Base: k.param("aux"), Index: b, Scale: 4}, g, g)
		VMOVUPS(g, Mem{Base: slot, Disp: 32})
	})
	k.phase2vec()
	VZEROUPPER()
	RET()
}
