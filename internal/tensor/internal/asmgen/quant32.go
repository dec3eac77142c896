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
	w, L, nb, dst, pf := packArgs()
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
	acc := loadAccs(accp, rows)
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
	blockFMA(m, 0, dw, is, acc)
	x.advance(32)
	m.advance(8)
	ADDQ(U32(panel32Bytes), panel)
	DECQ(nb)
	JNE(LabelRef("block"))
	storeAccs(accp, acc)
}

// Panel layout of Q4_0 as a model stores it (package tensor's PackPanels),
// the bytes of ggml's blocks: per pair of blocks of 16 rows, 4 vectors of
// nibbles of each block (vector 4h+t: byte 4r+i holds ggml's qs[4t+i] of
// block h of row r, whose low nibble is level 4t+i and high nibble level
// 16+4t+i), then the two blocks' scales as f16 (16 each).
const (
	p40nD     = 8 * 64
	p40nBytes = p40nD + 64
)

// maxDot40NRows is the largest number of activation rows one dot kernel of
// the Q4_0 panels takes; above inOrder40NRows a kernel continues the chains
// with a block's integers before the next block's (no registers to hold
// both), its lines no longer first read in order: with that many rows it
// computes more than it reads.
const (
	maxDot40NRows  = 8
	inOrder40NRows = 6
)

// Panel layout of Q5_0 as a model stores it, the bytes of ggml's blocks
// with each block's fifth bits reordered: per pair of blocks of 16 rows,
// for block h a vector of fifth bits at p50nQh(h) (bytes 4r..4r+3: row r's
// qh reordered so that bit t of byte i is the fifth bit of level 4t+i and
// bit 4+t that of level 16+4t+i: q50Order) then its 4 vectors of nibbles
// as p40n's at p50nLevels(h, t), then the two blocks' scales as f16 (16
// each) at p50nD. Each fifth-bit vector comes before the nibbles read
// with it, so that a kernel touches the lines first in ascending order.
const (
	p50nD     = 10 * 64
	p50nBytes = p50nD + 64
)

// p50nQh returns the offset of block h's fifth-bit vector in a Q5_0 panel.
func p50nQh(h int) int { return 320 * h }

// p50nLevels returns the offset of block h's nibble vector t.
func p50nLevels(h, t int) int { return 320*h + 64 + 64*t }

// q50Order reorders the 16 dwords of qh (one a row, bit j the fifth bit of
// level j) into a Q5_0 panel's order: bit 8i+4hh+t from bit 16hh+4t+i, a
// permutation of the bit index's five bits (i, t, hh) done as four swaps
// of two index bits (delta swaps: x ^= u ^ u<<δ, u = (x ^ x>>δ) & mask).
func q50Order(qh VecVirtual) {
	for _, sw := range []struct {
		delta uint8
		mask  uint32
	}{
		{3, 0x0A0A0A0A},  // index bits 0 and 2
		{6, 0x00CC00CC},  // 1 and 3
		{12, 0x0000F0F0}, // 2 and 4
		{8, 0x0000FF00},  // 3 and 4
	} {
		u := ZMM()
		VPSRLD(U8(sw.delta), qh, u)
		VPXORD(qh, u, u)
		VPANDD(splat(sw.mask), u, u)
		v := ZMM()
		VPSLLD(U8(sw.delta), u, v)
		VPTERNLOGD(U8(0x96), u, v, qh) // qh ^ u ^ v
	}
}

// pack40N emits the pack kernel of Q4_0 into the panels of p40n, or with
// five of Q5_0 into those of p50n: nb blocks (nb even) of 16 rows ldw
// bytes apart into dst.
func pack40N(five bool) {
	name, what, bytes, qs, pb := "qpackQ4_0NAVX512", "Q4_0", 18, 2, p40nBytes
	if five {
		name, what, bytes, qs, pb = "qpackQ5_0NAVX512", "Q5_0", 22, 6, p50nBytes
	}
	TEXT(name, NOSPLIT, packSig)
	Doc(fmt.Sprintf("%s packs nb (even) %s blocks of 16 weight rows ldw bytes apart into a panel that keeps their nibbles at dst and prefetches as many bytes from pf (see asmgen).", name, what))
	w, L, nb, dst, pf := packArgs()
	r := newRows16(w, L)
	idx := rowIndex(L)
	SHRQ(U8(1), nb)
	JE(LabelRef("done"))
	Label("pair")
	prefetchNext(pf, 2*16*bytes, true)
	for h := range 2 {
		for t, v := range transpose16x4(r, qs) {
			off := 64 * (4*h + t)
			if five {
				off = p50nLevels(h, t)
			}
			VMOVDQU64(v, Mem{Base: dst, Disp: off})
		}
		g := gatherD(r, idx, 0)
		if !five {
			VPMOVDW(g, Mem{Base: dst, Disp: p40nD + 32*h})
			r.advance(bytes)
			continue
		}
		VPMOVDW(g, Mem{Base: dst, Disp: p50nD + 32*h})
		qh := gatherD(r, idx, 2)
		q50Order(qh)
		VMOVDQU64(qh, Mem{Base: dst, Disp: p50nQh(h)})
		r.advance(bytes)
	}
	ADDQ(U32(pb), dst)
	DECQ(nb)
	JNE(LabelRef("pair"))
	Label("done")
	VZEROUPPER()
	RET()
}

// widen50N emits the kernel that widens Q5_0 panels that keep their
// nibbles (p50n, as a model stores them) into the pack kernel's panels of
// 32-weight blocks (a level byte each, scales as f32): for products of
// more activation rows than make up for making the levels whole in every
// pass. nb is the number of pairs of blocks.
func widen50N() {
	widenKernel("qwidenQ5_0NAVX512", "qwidenQ5_0NAVX512 widens nb pairs of blocks of a Q5_0 panel that keeps its nibbles at src into the pack kernel's Q5_0 panel at dst and prefetches as many bytes from pf (see asmgen).",
		p50nBytes, 2*panel32Bytes, func() func(src, dst Register) {
			c0f := splat(0x0f0f0f0f)
			c10 := splat(0x10101010)
			return func(src, dst Register) {
				for h := range 2 {
					for t := range 4 {
						lo, hi := fifth50(src, h, t, c0f, c10)
						VMOVDQU64(lo, Mem{Base: dst, Disp: panel32Bytes*h + 64*t})
						VMOVDQU64(hi, Mem{Base: dst, Disp: panel32Bytes*h + 64*(4+t)})
					}
					d := ZMM()
					VCVTPH2PS(Mem{Base: src, Disp: p50nD + 32*h}, d)
					VMOVUPS(d, Mem{Base: dst, Disp: panel32Bytes*h + 512})
				}
			}
		})
}

// widen40N emits the kernel that widens a Q4_0 panel that keeps its
// nibbles (pairs of blocks, p40nBytes) into the pack kernel's Q4_0 panel
// (panel32, levels 0..15 a byte): per block, nibble vector t's low nibbles
// are levels 4t..4t+3 of each row (panel32 vector t), its high ones levels
// 16+4t..16+4t+3 (vector 4+t); the scales widened to f32.
func widen40N() {
	widenKernel("qwidenQ4_0NAVX512", "qwidenQ4_0NAVX512 widens nb pairs of blocks of a Q4_0 panel that keeps its nibbles at src into the pack kernel's Q4_0 panel at dst and prefetches as many bytes from pf (see asmgen).",
		p40nBytes, 2*panel32Bytes, func() func(src, dst Register) {
			c0f := splat(0x0f0f0f0f)
			return func(src, dst Register) {
				for h := range 2 {
					for t := range 4 {
						v := ZMM()
						VMOVDQU64(Mem{Base: src, Disp: 64 * (4*h + t)}, v)
						hi := ZMM()
						VPSRLD(U8(4), v, hi)
						VPANDD(c0f, v, v)
						VPANDD(c0f, hi, hi)
						VMOVDQU64(v, Mem{Base: dst, Disp: panel32Bytes*h + 64*t})
						VMOVDQU64(hi, Mem{Base: dst, Disp: panel32Bytes*h + 64*(4+t)})
					}
					d := ZMM()
					VCVTPH2PS(Mem{Base: src, Disp: p40nD + 32*h}, d)
					VMOVUPS(d, Mem{Base: dst, Disp: panel32Bytes*h + 512})
				}
			}
		})
}

// fma40N continues the chains acc with block h of the pair at panel, its
// integers is, the scales at d.
func fma40N(m rowSet, panel Register, d, h int, is, acc []VecVirtual) {
	dw := ZMM()
	VCVTPH2PS(Mem{Base: panel, Disp: d + 32*h}, dw)
	blockFMA(m, 8*h, dw, is, acc)
}

// fifth50 returns the levels of nibble vector t of block h of the Q5_0
// panel at panel: the low nibbles' and the high ones', each with its fifth
// bit (bit t, and 4+t, of each byte of the block's fifth-bit vector) at
// bit 4.
func fifth50(panel Register, h, t int, c0f, c10 VecVirtual) (lo, hi VecVirtual) {
	q := Mem{Base: panel, Disp: p50nQh(h)}
	lo = ZMM()
	VMOVDQU64(Mem{Base: panel, Disp: p50nLevels(h, t)}, lo)
	hi = ZMM()
	VPSRLD(U8(4), lo, hi)
	b := shiftedMem(q, 4-t)
	VPANDD(c10, b, b)
	VPTERNLOGD(U8(ternAorB), c0f, b, lo)
	b2 := shiftedMem(q, -t)
	VPANDD(c10, b2, b2)
	VPTERNLOGD(U8(ternAorB), c0f, b2, hi)
	return lo, hi
}

// dot40N emits the dot kernel of rows activation rows and Q4_0 panels of
// p40n, nb pairs of blocks: per block and row the exact Σ (q−8)·x (from
// the activation's correction −8·Σx), both blocks' integers before their
// scales so that the pair's lines are read in order (the hardware
// prefetchers follow ascending lines), then per block in order acc =
// fma(float(I), dw·dx, acc).
//
// With five, the kernel of Q5_0 panels (p50n): each vector's levels made
// whole with their fifth bits, moved to bit 4 from the block's fifth-bit
// vector (the correction is then −16·Σx), 8 instructions a vector where
// Q4_0 takes 2, but one product a level as for Q4_0.
func dot40N(rows int, five bool) {
	name, what, d, pb := fmt.Sprintf("qdot40NAVX512R%d", rows), "Q4_0", p40nD, p40nBytes
	if five {
		name, what, d, pb = fmt.Sprintf("qdot50NAVX512R%d", rows), "Q5_0", p50nD, p50nBytes
	}
	TEXT(name, NOSPLIT, dotSig)
	Doc(fmt.Sprintf("%s continues the 16-lane f32 chains of %d activation rows over nb pairs of blocks of a %s panel that keeps the nibbles (see asmgen).", name, rows, what))
	x, m, panel, nb, accp := dotArgs(rows)
	acc := loadAccs(accp, rows)
	c0f := splat(0x0f0f0f0f)
	var c10 VecVirtual
	if five {
		c10 = splat(0x10101010)
	}
	TESTQ(nb, nb)
	JE(LabelRef("store"))
	Label("pair")
	var is [2][]VecVirtual
	for h := range 2 {
		is[h] = make([]VecVirtual, rows)
		hs := make([]VecVirtual, rows)
		for r := range rows {
			is[h][r] = ZMM()
			VPBROADCASTD(m.at(r, 8*h+4), is[h][r])
			if !five {
				hs[r] = ZMM()
				VXORPS(hs[r], hs[r], hs[r])
			}
		}
		for t := range 4 {
			if five {
				lo, hi := fifth50(panel, h, t, c0f, c10)
				for r := range rows {
					vpdpbusd(x.at(r, 32*h+4*t), lo, is[h][r], true)
					vpdpbusd(x.at(r, 32*h+16+4*t), hi, is[h][r], true)
				}
				continue
			}
			v := Mem{Base: panel, Disp: 64 * (4*h + t)}
			l, hi := ZMM(), ZMM()
			VPANDD(v, c0f, l)
			VPANDND(v, c0f, hi) // 16 times the high nibbles
			for r := range rows {
				vpdpbusd(x.at(r, 32*h+4*t), l, is[h][r], true)
				vpdpbusd(x.at(r, 32*h+16+4*t), hi, hs[r], true)
			}
		}
		if !five {
			for r := range rows {
				VPSRAD(U8(4), hs[r], hs[r]) // exact: a multiple of 16
				VPADDD(hs[r], is[h][r], is[h][r])
			}
		}
		if rows > inOrder40NRows {
			fma40N(m, panel, d, h, is[h], acc)
		}
	}
	if rows <= inOrder40NRows {
		for h := range 2 {
			fma40N(m, panel, d, h, is[h], acc)
		}
	}
	x.advance(64)
	m.advance(16)
	ADDQ(U32(pb), panel)
	DECQ(nb)
	JNE(LabelRef("pair"))
	storeAccs(accp, acc)
}
