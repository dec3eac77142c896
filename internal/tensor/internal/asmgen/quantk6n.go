package main

// Q6_K panels that keep ggml's bytes (the layout a model stores, package
// tensor's PackPanels): their pack kernel, dot kernels and the kernel that
// widens them into the pack kernel's Q6_K panels (quantk.go's p6 layout).

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Panel layout of a Q6_K super-block of 16 rows with ggml's bytes kept,
// 1% more than ggml's blocks (3,392 bytes, 53 lines). ggml's ql vector v
// (bytes 4v..4v+3 of each row r at bytes 4r..4r+3) and qh vector u (qh
// bytes 4u..4u+3 likewise): ql vector 16n+q (half n, q < 8) holds in its
// low nibbles levels 4q..4q+3 of sub-block 8n+q/4 and in its high ones
// those of sub-block 8n+4+q/4; ql vector 16n+8+q those of sub-blocks
// 8n+2+q/4 and 8n+6+q/4; qh vector 8n+q holds the top two bits of all
// four, in bits 0–1, 4–5 (ql vector 16n+q) and 2–3, 6–7 (16n+8+q). They
// come in groups (n, g) of q = 4g..4g+3, each q's qh vector then its two
// ql vectors, and after each group the line of the 4 sub-blocks it
// completes (8n+2k+g for k < 4, 16 scale bytes each, one a row), so that
// a kernel touches every line first in ascending order; d as f32 last.
const (
	p6nGroup = 13 * 64
	p6nD     = 4 * p6nGroup
	p6nBytes = p6nD + 64
)

// p6nQh returns the offset of qh vector u in a Q6_K panel.
func p6nQh(u int) int {
	n, q := u/8, u%8
	return p6nGroup*(2*n+q/4) + 192*(q%4)
}

// p6nQl returns the offset of ql vector v in a Q6_K panel.
func p6nQl(v int) int {
	n, q, second := v/16, v%8, v%16/8
	return p6nQh(8*n+q) + 64 + 64*second
}

// p6nScales returns the offset of the scale line of group (n, g).
func p6nScales(n, g int) int { return p6nGroup*(2*n+g) + 12*64 }

// maxDot6NRows is the largest number of activation rows one dot kernel of
// the Q6_K panels takes: each row has four sub-block sums in a group.
const maxDot6NRows = 4

// groupM6NRows is the most activation rows for which a Q6_K dot kernel
// computes Σ scale·Σ x as it reads each group's scales (more have no
// registers for it and compute it from int16 pairs after the super-block):
// the super-block's end then has no burst of arithmetic, which cost one
// row 6–9 points of the read (84–86% against 90–97% without it).
const groupM6NRows = 2

// levels6N returns the level vectors of q's two ql vectors in group (n, g)
// of the Q6_K panel at p (q = 4g+j): the low and high nibbles of ql
// vector 16n+q and of 16n+8+q, each with its two top bits from qh vector
// 8n+q moved to bits 4–5, in the order of the group's sub-blocks (k = 0..3:
// 8n+g, 8n+2+g, 8n+4+g, 8n+6+g).
func levels6N(p Register, n, q int, c0f, c30 VecVirtual) [4]VecVirtual {
	qh := Mem{Base: p, Disp: p6nQh(8*n + q)}
	var lv [4]VecVirtual
	for second := range 2 {
		// The low nibbles' top bits are bits 2·second, 2·second+1 of
		// each qh byte, the high ones' 4+2·second, 5+2·second. The qh
		// vector is read first: it lies before the ql vectors, and a
		// kernel that touches its lines out of order reads less.
		b := shiftedMem(qh, 4-2*second)
		VPANDD(c30, b, b)
		b2 := shiftedMem(qh, -2*second)
		VPANDD(c30, b2, b2)
		ql := Mem{Base: p, Disp: p6nQl(16*n + 8*second + q)}
		lo, hi := ZMM(), ZMM()
		VMOVDQU64(ql, lo)
		VPSRLD(U8(4), ql, hi)
		VPTERNLOGD(U8(ternAorB), c0f, b, lo)
		VPTERNLOGD(U8(ternAorB), c0f, b2, hi)
		lv[second], lv[2+second] = lo, hi
	}
	return lv
}

// dot6N emits the dot kernel of rows activation rows and Q6_K panels of
// p6n: per super-block and row I = Σ scale·Σ q·x − 32·Σ scale·Σ x, exact,
// then acc = fma(float(I), d·dy, acc), as dotK's Q6_K panels.
func dot6N(rows int) {
	name := fmt.Sprintf("qdot6NAVX512R%d", rows)
	TEXT(name, NOSPLIT, dotSig)
	Doc(fmt.Sprintf("%s continues the 16-lane f32 chains of %d activation rows over nb super-blocks of a Q6_K panel that keeps ggml's bytes (see asmgen).", name, rows))
	x, m, panel, nb, accp := dotArgs(rows)
	acc := loadAccs(accp, rows)
	c0f := splat(0x0f0f0f0f)
	c30 := splat(0x30303030)
	TESTQ(nb, nb)
	JE(LabelRef("store"))
	Label("block")
	is := make([]VecVirtual, rows)
	ms := make([]VecVirtual, rows) // Σ scale·Σ x
	zero := func() {
		for r := range rows {
			ms[r] = ZMM()
			VXORPS(ms[r], ms[r], ms[r])
		}
	}
	var cLo VecVirtual
	if rows <= groupM6NRows {
		zero()
		cLo = splat(0xffff)
	}
	for n := range 2 {
		for g := range 2 {
			var sums [4][]VecVirtual
			for k := range sums {
				sums[k] = make([]VecVirtual, rows)
				for r := range rows {
					sums[k][r] = ZMM()
					VXORPS(sums[k][r], sums[k][r], sums[k][r])
				}
			}
			for j := range 4 {
				q := 4*g + j
				lv := levels6N(panel, n, q, c0f, c30)
				for k, l := range lv {
					for r := range rows {
						vpdpbusd(x.at(r, 128*n+32*k+4*q), l, sums[k][r], true)
					}
				}
			}
			for k := range 4 {
				sc := ZMM()
				VPMOVSXBD(Mem{Base: panel, Disp: p6nScales(n, g) + 16*k}, sc)
				if rows <= groupM6NRows {
					// Sub-block s = 8n+2k+g's Σ x is one half of the
					// pair (s even: the low one): the scale in that
					// half, zero in the other.
					w := ZMM()
					if g == 0 {
						VPANDD(cLo, sc, w)
					} else {
						VPSLLD(U8(16), sc, w)
					}
					for r := range rows {
						vpdpwssd(m.at(r, metaSums16+4*(4*n+k)), w, ms[r], true)
					}
				}
				for r := range rows {
					if n == 0 && g == 0 && k == 0 {
						is[r] = ZMM()
						VPMULLD(sc, sums[k][r], is[r])
						continue
					}
					VPMULLD(sc, sums[k][r], sums[k][r])
					VPADDD(sums[k][r], is[r], is[r])
				}
			}
		}
	}
	if rows > groupM6NRows {
		// Σ scale·Σ x from the scale lines (now in the L1) as int16
		// pairs, sub-blocks 2i and 2i+1 (groups (n, 0) and (n, 1), slot
		// i−4n).
		zero()
		cLo = splat(0xffff)
		for i := range 8 {
			pair := scalePair6N(panel, i, cLo)
			for r := range rows {
				vpdpwssd(m.at(r, metaSums16+4*i), pair, ms[r], true)
			}
		}
	}
	d := ZMM()
	VMOVUPS(Mem{Base: panel, Disp: p6nD}, d)
	for r := range rows {
		VPSLLD(U8(5), ms[r], ms[r])
		VPSUBD(ms[r], is[r], is[r])
	}
	blockFMA(m, 0, d, is, acc)
	x.advance(256)
	m.advance(metaKBytes)
	ADDQ(U32(p6nBytes), panel)
	DECQ(nb)
	JNE(LabelRef("block"))
	storeAccs(accp, acc)
}

// scalePair6N returns the scales of sub-blocks 2i and 2i+1 of the Q6_K
// panel at p as int16 pairs (2i in the low half of each row's dword).
func scalePair6N(p Register, i int, cLo VecVirtual) VecVirtual {
	n, k := i/4, i%4
	a, b := ZMM(), ZMM()
	VPMOVSXBD(Mem{Base: p, Disp: p6nScales(n, 0) + 16*k}, a)
	VPMOVSXBD(Mem{Base: p, Disp: p6nScales(n, 1) + 16*k}, b)
	VPSLLD(U8(16), b, b)
	VPTERNLOGD(U8(ternAorB), cLo, b, a)
	return a
}

// pack6N emits the pack kernel of Q6_K into the panels of p6n.
func pack6N() {
	const bytes = 210
	TEXT("qpackQ6_KNAVX512", NOSPLIT, packSig)
	Doc("qpackQ6_KNAVX512 packs nb Q6_K super-blocks of 16 weight rows ldw bytes apart into a panel that keeps their bytes at dst and prefetches as many bytes from pf (see asmgen).")
	w, L, nb, dst, pf := packArgs()
	r := newRows16(w, L)
	idx := rowIndex(L)
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	prefetchNext(pf, 16*bytes, true)
	for c := range 4 {
		for t, v := range transpose16x8(r, 32*c) {
			VMOVDQU64(v, Mem{Base: dst, Disp: p6nQl(8*c + t)})
		}
	}
	for c := range 2 {
		for t, v := range transpose16x8(r, 128+32*c) {
			VMOVDQU64(v, Mem{Base: dst, Disp: p6nQh(8*c + t)})
		}
	}
	// Scale s = 4t+i is byte i of vector t's dwords; its line is that of
	// group (s/8, s%2), slot (s%8)/2.
	for t, v := range transpose16x4(r, 192) {
		for i := range 4 {
			s := 4*t + i
			b := shifted(v, -8*i)
			VPMOVDB(b, Mem{Base: dst, Disp: p6nScales(s/8, s%2) + 16*(s%8/2)})
		}
	}
	VMOVUPS(gatherF16(r, idx, 206, true), Mem{Base: dst, Disp: p6nD})
	r.advance(bytes)
	ADDQ(U32(p6nBytes), dst)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// widen6N emits the kernel that widens Q6_K panels of p6n into the pack
// kernel's (p6: a level byte each, the scales as int32 and int16 pairs),
// for products of more rows than make up for making the levels whole in
// every pass.
func widen6N() {
	widenKernel("qwidenQ6_KNAVX512", "qwidenQ6_KNAVX512 widens nb super-blocks of a Q6_K panel that keeps ggml's bytes at src into the pack kernel's Q6_K panel at dst and prefetches as many bytes from pf (see asmgen).",
		p6nBytes, p6Bytes, func() func(src, dst Register) {
			c0f := splat(0x0f0f0f0f)
			c30 := splat(0x30303030)
			cLo := splat(0xffff)
			return func(src, dst Register) {
				for n := range 2 {
					for g := range 2 {
						for j := range 4 {
							for k, l := range levels6N(src, n, 4*g+j, c0f, c30) {
								s := 8*n + 2*k + g
								VMOVDQU64(l, Mem{Base: dst, Disp: p6Levels + 64*(4*s+j)})
							}
						}
						for k := range 4 {
							sc := ZMM()
							VPMOVSXBD(Mem{Base: src, Disp: p6nScales(n, g) + 16*k}, sc)
							VMOVDQU64(sc, Mem{Base: dst, Disp: p6Scales + 64*(8*n+2*k+g)})
						}
					}
				}
				for i := range 8 {
					VMOVDQU64(scalePair6N(src, i, cLo), Mem{Base: dst, Disp: p6Pairs + 64*i})
				}
				d := ZMM()
				VMOVUPS(Mem{Base: src, Disp: p6nD}, d)
				VMOVUPS(d, Mem{Base: dst, Disp: p6D})
			}
		})
}
