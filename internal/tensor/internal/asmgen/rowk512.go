package main

// The AVX-512 K-quant row kernels, rowQ4K512 (Q4_K, Q5_K) and rowQ6K512:
// ZMM vectors of two 32-weight sub-blocks each, the scales applied after
// the integer sums (see rowQ4K512), and the ZMM helpers only they use.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// zmmZero returns a zeroed ZMM.
func zmmZero() VecVirtual {
	v := ZMM()
	VXORPS(v, v, v)
	return v
}

// wordIndex emits (once per name) a table of 32 word indices and loads it
// into a ZMM.
func wordIndex(name string, idx [32]int) VecVirtual {
	var b []byte
	for _, i := range idx {
		b = append(b, byte(i), 0)
	}
	z := ZMM()
	VMOVDQU64(table(name, b), z)
	return z
}

// foldZ returns an XMM holding the sums of the four 128-bit quarters of
// the dword lanes of z.
func foldZ(z VecVirtual) VecVirtual {
	y := YMM()
	VEXTRACTI64X4(U8(1), z, y)
	VPADDD(z.AsY(), y, y)
	x := XMM()
	VEXTRACTI32X4(U8(1), y, x)
	VPADDD(y.AsX(), x, x)
	return x
}

// q4kPerm is the order of the 32-byte activation chunks (sub-blocks of
// 32) the AVX-512 Q4_K/Q5_K row kernel wants per super-block: a ZMM of
// low nibbles of qs[64i:64i+64] holds sub-blocks 4i and 4i+2, of high
// ones 4i+1 and 4i+3.
var q4kPerm = [8]int{0, 2, 1, 3, 4, 6, 5, 7}

// rowQ4K512 emits the AVX-512 Q4_K (Q5_K with five) row kernel. Unlike
// rowQ4K, it takes the integer dot product of every 32-weight sub-block
// first, unscaled, and applies the 6-bit scales after: per super-block
// four VPDPBUSDs (levels times activations, two sub-blocks per vector,
// the activations in q4kPerm order, 4 products per dword lane) reduced
// by one tree to its 8 sub-block sums; those of two super-blocks times
// their scales by one VPMULLD. Then one tree for the 4 super-blocks of a
// group reduces I (the scaled sums) and M (the mins times the
// activation sums per 32, one VPMADDWD per two super-blocks): lane
// q4kLane(p, t) of its result holds pair p (I or M) of super-block t,
// and the scale products are stored in the same lanes for phase 2.
//
// The dot products thus depend on nothing but loads. The kernel with the
// scales spread by VPERMW and applied by VPDPWSSD (one instruction more
// per 64 weights) ran no faster for fewer instructions: on the Zen 5 its
// groups waited on the chain from the scale unpacking through the
// VPERMWs, and the next groups' work could not enter the scheduler.
func rowQ4K512(five bool) {
	k := &rowKern{avx512: true, group: 4, pairs: 2, pfL1: true}
	k.pos = q4kLane
	nm, bytes, qs := "Q4_K", 144, 16
	if five {
		nm, bytes, qs = "Q5_K", 176, 48
	}
	name := "qrow" + nm + "AVX512"
	TEXT(name, NOSPLIT, k.sig())
	Doc(fmt.Sprintf("%s computes up to 8 %s weight rows times one activation row (activation sub-blocks in q4kPerm order; see asmgen's rowquant.go).", name, nm))
	c0f := splat(0x0f0f0f0f)
	ones := splat(0x00010001)
	// The sub-block of lane l of a super-block's 8 sums (the tree's
	// order): lanes 0..3 the first sub-blocks of vectors 0..3, 4..7 the
	// second ones.
	sub := func(l int) int { return q4kPerm[2*(l%4)+l/4] }
	// Scale j of super-block 2i+s is word 16s + j%4 + 8(j/4) of the
	// unpacked words of super-blocks 2i, 2i+1 (see below); scIdx puts it
	// in the low word of dword lane 8s + l for the sum of lane l.
	var w [32]int
	for L := range 16 {
		j := sub(L % 8)
		w[2*L] = 16*(L/8) + j%4 + 8*(j/4)
	}
	scIdx := wordIndex("q4kscdw", w)
	evenWords := K()
	{
		g := GP32()
		MOVL(U32(0x55555555), g)
		KMOVD(g, evenWords)
	}
	// dy_t to the lanes of super-block t: lane l holds t = 2(l%2) + l/4.
	var dyi []byte
	for l := range 8 {
		dyi = append(dyi, byte(2*(l%2)+l/4), 0, 0, 0)
	}
	dyIdx := YMM()
	VMOVDQU64(table("q4kdyidx", dyi), dyIdx)
	var c10, rot [2]VecVirtual
	if five {
		c10[0] = splat(0x10101010)
		// The fifth bit of sub-block j is bit j of qh: rotate it to
		// bit 4 of its byte, for the two sub-blocks of each vector.
		for h := range 2 {
			var rb []byte
			for _, j := range [2]int{q4kPerm[2*h], q4kPerm[2*h+1]} {
				for range 8 {
					r := (4 - j + 32) % 32
					rb = append(rb, byte(r), 0, 0, 0)
				}
			}
			rot[h] = ZMM()
			VMOVDQU64(table(fmt.Sprintf("q5krot%d", h), rb), rot[h])
		}
	}
	// The group's scales and mins unpack in one vector (quarter t: bytes
	// 4..19 of super-block t): scales 0..3 and mins 0..3 are bytes 0..7
	// & 63; scales 4..7 the low nibbles of bytes 8..11 with the top bits
	// of bytes 0..3 at bits 4, 5; mins 4..7 the high nibbles with the top
	// bits of bytes 4..7.
	var ma, mh, mt []byte
	for range 4 {
		ma = append(ma, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x0f, 0x0f, 0x0f, 0x0f, 0, 0, 0, 0)
		mh = append(mh, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0f, 0x0f, 0x0f, 0x0f)
		mt = append(mt, 0x30, 0x30, 0x30, 0x30, 0x30, 0x30, 0x30, 0x30, 0, 0, 0, 0, 0, 0, 0, 0)
	}
	maskA, maskH, maskT := table("q4kunpacka", ma), table("q4kunpackh", mh), table("q4kunpackt", mt)
	// d_t, dmin_t (words 8t, 8t+1 of the group's first 16 bytes of each
	// super-block, quarter t) to the words in q4kLane order.
	var dw [32]int
	var neg []byte
	for l := range 8 {
		for t := range 4 {
			for p := range 2 {
				if q4kLane(p, t) == l {
					dw[l] = 8*t + p
					s := byte(0)
					if p == 1 {
						s = 0x80 // −M
					}
					neg = append(neg, 0, 0, 0, s)
				}
			}
		}
	}
	dIdx := wordIndex("q4kdidx", dw)
	negM := table("q4knegm", neg)
	k.phase1(256, bytes, func(wq, xq, b, slot GPVirtual) {
		// The unscaled sub-block sums of each super-block: lane l of
		// quarter q of sums[t] is quarter q of vector l's products.
		var sums [4]VecVirtual
		for t := range 4 {
			blk := func(d int) Mem { return Mem{Base: wq, Disp: bytes*t + d} }
			var qh [2]VecVirtual
			if five {
				q := ZMM()
				VBROADCASTI64X4(blk(16), q)
				for h := range 2 {
					qh[h] = ZMM()
					VPROLVD(rot[h], q, qh[h])
				}
			}
			d := make([]VecVirtual, 4)
			for i := range 2 {
				// One load (most cross a cache line: 144-byte blocks).
				m := ZMM()
				VMOVDQU64(blk(qs+64*i), m)
				lo, hi := ZMM(), ZMM()
				VPANDD(m, c0f, lo)
				VPSRLW(U8(4), m, hi)
				VPANDD(c0f, hi, hi)
				for h, v := range []VecVirtual{lo, hi} {
					if five {
						// qh bits of this vector's sub-blocks: the
						// rotation of its pair (lo: 4i, 4i+2; hi:
						// 4i+1, 4i+3) shifted by 4i.
						f := qh[h]
						if i == 1 {
							f = ZMM()
							VPROLD(U8(28), qh[h], f)
						}
						VPTERNLOGD(U8(0xF8), c10[0], f, v)
					}
					d[2*i+h] = zmmZero()
					vpdpbusd(Mem{Base: xq, Disp: 256*t + 128*i + 64*h}, v, d[2*i+h], false)
				}
			}
			sums[t] = packTree4(d, ones)
		}
		// Quarter t: d, dmin and the 12 scale bytes of super-block t.
		raw := ZMM()
		VMOVDQU32(Mem{Base: wq}, raw.AsX())
		for t := 1; t < 4; t++ {
			VINSERTI32X4(U8(t), Mem{Base: wq, Disp: bytes * t}, raw, raw)
		}
		v := ZMM()
		VPSRLDQ(U8(4), raw, v)
		u, h, tp := ZMM(), ZMM(), ZMM()
		VPANDD(maskA, v, u)
		VPSLLDQ(U8(4), v, h)
		VPSRLW(U8(4), h, h)
		VPSRLW(U8(2), v, tp)
		VPANDD(maskT, tp, tp)
		VPSLLDQ(U8(8), tp, tp)
		VPTERNLOGD(U8(0xF8), maskH, h, tp) // tp | (h & maskH)
		VPORD(tp, u, u)
		// Words of super-blocks 0, 1 and 2, 3.
		sw := [2]VecVirtual{ZMM(), ZMM()}
		VPMOVZXBW(u.AsY(), sw[0])
		uh := YMM()
		VEXTRACTI64X4(U8(1), u, uh)
		VPMOVZXBW(uh, sw[1])
		// M's partial sums: the words times the activation sums per 32
		// (32 bytes per super-block after the nb scales in aux).
		bs := k.param("aux")
		LEAQ(Mem{Base: bs, Index: k.nb, Scale: 4}, bs)
		o := GP64()
		MOVQ(b, o)
		SHLQ(U8(5), o)
		ADDQ(o, bs)
		// Per pair of super-blocks: quarters 0+1 of sums (the first
		// sub-blocks of the 4 vectors) and 2+3 (the second ones) side by
		// side, times the scales.
		var z [4]VecVirtual
		for i := range 2 {
			x, y := ZMM(), ZMM()
			VSHUFI64X2(U8(0b10_00_10_00), sums[2*i+1], sums[2*i], x)
			VSHUFI64X2(U8(0b11_01_11_01), sums[2*i+1], sums[2*i], y)
			VPADDD(y, x, x)
			sc := ZMM()
			VPERMW_Z(sw[i], scIdx, evenWords, sc)
			VPMULLD(sc, x, x)
			z[i] = x
			z[2+i] = ZMM()
			VPMADDWD(Mem{Base: bs, Disp: 64 * i}, sw[i], z[2+i])
		}
		// Quarter q of r, lane j: the sum of quarter q of z[j]; the sums
		// of quarters 0+1 (super-blocks 0, 2) and 2+3 (1, 3).
		r := tree4(z[:], ZMM)
		g := ZMM()
		VSHUFI64X2(U8(0b11_01_10_00), r, r, g)
		c := YMM()
		VEXTRACTI64X4(U8(1), g, c)
		VPADDD(g.AsY(), c, c)
		f := YMM()
		VCVTDQ2PS(c, f)
		VMOVUPS(f, Mem{Base: slot})
		x := ZMM()
		VPERMW(raw, dIdx, x)
		dd := YMM()
		VCVTPH2PS(x.AsX(), dd)
		dy := YMM()
		VPERMPS(Mem{Base: k.param("aux"), Index: b, Scale: 4}, dyIdx, dy)
		VMULPS(dy, dd, dd)
		// fma(M, −dmin·dy, acc) is fma(−M, dmin·dy, acc) exactly; the
		// sign goes on this side, off the integers' longer chain.
		VXORPS(negM, dd, dd)
		VMOVUPS(dd, Mem{Base: slot, Disp: 32})
	})
	k.phase2()
	VZEROUPPER()
	RET()
}

// packTree4 is tree4 for 4 ZMMs of dword lanes whose sums of pairs fit in
// int16 (VPDPBUSD sums of 4 products of levels 0..31 and int8
// activations: at most 4·31·128 = 15872): each level packs two vectors to
// words (VPACKSSDW, exact here) and adds the pairs by VPMADDWD by ones,
// half the shuffles of tree4's unpacks (the Zen 5's shuffle pipes are
// this kernel's busiest).
func packTree4(p []VecVirtual, ones VecVirtual) VecVirtual {
	var a [2]VecVirtual
	for i := range 2 {
		a[i] = ZMM()
		VPACKSSDW(p[2*i+1], p[2*i], a[i])
		VPMADDWD(ones, a[i], a[i])
	}
	r := ZMM()
	VPACKSSDW(a[1], a[0], r)
	VPMADDWD(ones, r, r)
	return r
}

// q4kLane is the lane of the AVX-512 Q4_K/Q5_K row kernel's group vectors
// that holds pair p (0: I, 1: M) of super-block t (see rowQ4K512).
func q4kLane(p, t int) int { return 4*(t%2) + 2*p + t/2 }

// rowQ6K512 emits the AVX-512 Q6_K row kernel: that of rowQ6K with 512-bit
// vectors: the 64 low nibbles of ql[64h:64h+64] with their qh bits are the
// levels of sub-blocks 8h..8h+3 (one per 128-bit quarter), the high
// nibbles those of 8h+4..8h+7, in activation order; the scales of a
// vector's four sub-blocks are spread by VPERMW.
func rowQ6K512() {
	k := &rowKern{avx512: true, group: 4, pairs: 1}
	const bytes = 210
	name := "qrowQ6_KAVX512"
	TEXT(name, NOSPLIT, k.sig())
	Doc(fmt.Sprintf("%s computes up to 8 Q6_K weight rows times one activation row (see asmgen's rowquant.go).", name))
	c0f := splat(0x0f0f0f0f)
	c30 := splat(0x30303030)
	var idx [4]VecVirtual
	for i := range idx {
		var w [32]int
		for l := range w {
			w[l] = 4*i + l/8
		}
		idx[i] = wordIndex(fmt.Sprintf("q6scidx%d", i), w)
	}
	// The qh bits of quarter q at bits 4, 5: shift left by 4 − 2q words
	// (q < 2, low nibbles), right by 2q − 4 (q ≥ 2, high nibbles).
	var sh [2]VecVirtual
	for i, v := range [2][2]int{{4, 2}, {0, 2}} {
		var w [32]int
		for l := range w {
			w[l] = v[l/16]
		}
		sh[i] = wordIndex(fmt.Sprintf("q6qhshift%d", i), w)
	}
	k.phase1(256, bytes, func(wq, xq, b, slot GPVirtual) {
		mq := GP64()
		MOVQ(b, mq)
		SHLQ(U8(6), mq)
		ADDQ(paramMem("meta"), mq)
		z := make([]VecVirtual, 4)
		for t := range 4 {
			blk := func(d int) Mem { return Mem{Base: wq, Disp: bytes*t + d} }
			sw := YMM()
			VPMOVSXBW(blk(192), sw)
			off := YMM()
			VPMADDWD(Mem{Base: mq, Disp: 64*t + metaSums16}, sw, off)
			acc := [2]VecVirtual{zmmZero(), zmmZero()}
			for h := range 2 {
				q := ZMM()
				VBROADCASTI64X4(blk(128+32*h), q)
				hb := [2]VecVirtual{ZMM(), ZMM()}
				VPSLLVW(sh[0], q, hb[0])
				VPSRLVW(sh[1], q, hb[1])
				// One load (most cross a cache line: 210-byte blocks).
				ql, qs := ZMM(), ZMM()
				VMOVDQU64(blk(64*h), ql)
				VPSRLW(U8(4), ql, qs)
				for i := range 2 {
					VPANDD(c30, hb[i], hb[i])
					// hb | (levels & 0x0f)
					if i == 0 {
						VPTERNLOGD(U8(0xF8), ql, c0f, hb[i])
					} else {
						VPTERNLOGD(U8(0xF8), c0f, qs, hb[i])
					}
					p := ZMM()
					VPMADDUBSW(Mem{Base: xq, Disp: 256*t + 128*h + 64*i}, hb[i], p)
					s := ZMM()
					VPERMW(sw.AsZ(), idx[2*h+i], s)
					vpdpwssd(s, p, acc[i], false)
				}
			}
			VPADDD(acc[1], acc[0], acc[0])
			// off's upper half is zero (a 256-bit result).
			VPSLLD(U8(5), off, off)
			VPSUBD(off.AsZ(), acc[0], acc[0])
			z[t] = acc[0]
		}
		ix := foldZ(tree4(z, ZMM))
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
