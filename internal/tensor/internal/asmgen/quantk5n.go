package main

// Q5_K panels that keep ggml's nibbles (the layout a model stores, package
// tensor's PackPanels): their dot kernels and the kernel that widens them
// into the pack kernel's panels; quantk.go has their pack kernel.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Panel layout of a Q5_K super-block of 16 rows with its nibbles kept,
// 2.3% more than ggml's blocks (2,880 bytes, 45 lines): a header of 5
// lines, the mins as bytes in pairs (32 per pair i: min 2i and 2i+1 of
// row r at bytes 2r and 2r+1), d and dmin as f16 (16 each), the 8
// sub-block scales as bytes (16 per sub-block, one a row); then for t < 8
// the vector of fifth bits t (byte 4r+i holds ggml's qh[4t+i] of row r,
// whose bit j is the fifth bit of level 4t+i of sub-block j) at p5Qh(t)
// and the 4 nibble vectors that need it (vector 8p+t, as a Q4_K panel's:
// ggml's qs[32p+4t+i] of row r at byte 4r+i) at p5Level(8p+t). A one-row
// kernel reads the header first and then every line once, in order. Laid
// out by sub-block pair instead (a pair's 8 nibble vectors together), the
// one-row kernel re-read each fifth-bit vector up to 30 lines back and
// read 82–86% of the read limit (Q4_K's, without fifth bits, 93–97%); in
// this order 94–99%. With the 8 fifth-bit vectors first it read 35%.
const (
	p5Mins   = 0
	p5D      = p5Mins + 4*32
	p5Dmin   = p5D + 32
	p5Scales = p5Dmin + 32
	p5Body   = p5Scales + 8*16
	p5Bytes  = p5Body + 40*64
)

// p5Header is where a Q5_K panel keeps its header (packHeaderK).
var p5Header = kHeader{scales: p5Scales, mins: p5Mins, d: p5D, dmin: p5Dmin}

// p5Qh returns the offset of fifth-bit vector t in a Q5_K panel.
func p5Qh(t int) int { return p5Body + 320*t }

// p5Level returns the offset of nibble vector v = 8p+t in a Q5_K panel.
func p5Level(v int) int { return p5Qh(v%8) + 64 + 64*(v/8) }

// maxDotK5Rows is the largest number of activation rows one Q5_K dot
// kernel takes; up to inOrderK5Rows the kernel reads the panel's lines in
// order, the levels of all four sub-block pairs (8 sums a row) at once.
// More rows have no registers for that: they take two pairs a pass over
// the fifth-bit vectors, and the header after the levels (one llama-1b
// layer, one Zen 4 thread: 3 rows 158–177 GFLOP/s, 4 rows 154–161, where
// one pair a pass made 106–113 and 126–132).
const (
	maxDotK5Rows  = 4
	inOrderK5Rows = 2
)

// dotK5N emits the dot kernel of rows activation rows and Q5_K panels of
// p5: per super-block and row the exact M = Σ min·Σ x (from the header,
// first) and I = Σ scale·Σ q·x (each sub-block pair's as it completes, its
// levels made whole with their fifth bits: 8 instructions a vector of
// nibbles, one VPDPBUSD a level), then acc = fma(float(I), d·dy, acc) and
// acc = fma(−float(M), dmin·dy, acc), as dotK's Q4_K/Q5_K panels.
func dotK5N(rows int) {
	name := fmt.Sprintf("qdotK5NAVX512R%d", rows)
	TEXT(name, NOSPLIT, dotSig)
	Doc(fmt.Sprintf("%s continues the 16-lane f32 chains of %d activation rows over nb super-blocks of a Q5_K panel that keeps the nibbles (see asmgen).", name, rows))
	x, m, panel, nb, accp := dotArgs(rows)
	acc := loadAccs(accp, rows)
	c0f := splat(0x0f0f0f0f)
	c10 := splat(0x10101010)
	TESTQ(nb, nb)
	JE(LabelRef("store"))
	Label("block")
	zeroed := func() []VecVirtual {
		vs := make([]VecVirtual, rows)
		for r := range rows {
			vs[r] = ZMM()
			VXORPS(vs[r], vs[r], vs[r])
		}
		return vs
	}
	// One or two rows read the header's lines first and in order: the
	// mins, d and dmin, then the first scale of each of the scales' two
	// lines (the rest hit the L1 later). More rows have no registers to
	// hold them through the levels and read them where they need them.
	inOrder := rows <= inOrderK5Rows
	var ms []VecVirtual
	var d, dmin VecVirtual
	header := func() {
		ms = zeroed()
		for i := range 4 {
			v := ZMM()
			VPMOVZXBW(Mem{Base: panel, Disp: p5Mins + 32*i}, v)
			for r := range rows {
				vpdpwssd(m.at(r, metaSums32+4*i), v, ms[r], true)
			}
		}
		d, dmin = ZMM(), ZMM()
		VCVTPH2PS(Mem{Base: panel, Disp: p5D}, d)
		VCVTPH2PS(Mem{Base: panel, Disp: p5Dmin}, dmin)
	}
	var sc [8]VecVirtual
	if inOrder {
		header()
		for _, j := range []int{0, 4} {
			sc[j] = ZMM()
			VPMOVZXBD(Mem{Base: panel, Disp: p5Scales + 16*j}, sc[j])
		}
	}
	is := make([]VecVirtual, rows)
	var lo, hi [4][]VecVirtual
	levels := func(p, t int) {
		l, h := fifthLevelsMem(Mem{Base: panel, Disp: p5Level(8*p + t)}, Mem{Base: panel, Disp: p5Qh(t)}, p, c0f, c10)
		for r := range rows {
			vpdpbusd(x.at(r, 64*p+4*t), l, lo[p][r], true)
			vpdpbusd(x.at(r, 64*p+32+4*t), h, hi[p][r], true)
		}
	}
	// The sub-block pairs one pass over the fifth-bit vectors takes: all
	// four (each line read once, in order), or with more rows two.
	span := 4
	if !inOrder {
		span = 2
	}
	for p := range 4 {
		if p%span == 0 {
			for q := p; q < p+span; q++ {
				lo[q], hi[q] = zeroed(), zeroed()
			}
			for t := range 8 {
				for q := p; q < p+span; q++ {
					levels(q, t)
				}
			}
		}
		for k, ds := range [][]VecVirtual{lo[p], hi[p]} {
			j := 2*p + k
			if sc[j] == nil {
				sc[j] = ZMM()
				VPMOVZXBD(Mem{Base: panel, Disp: p5Scales + 16*j}, sc[j])
			}
			for r := range rows {
				if j == 0 {
					is[r] = ZMM()
					VPMULLD(sc[j], ds[r], is[r])
					continue
				}
				VPMULLD(sc[j], ds[r], ds[r])
				VPADDD(ds[r], is[r], is[r])
			}
		}
	}
	if !inOrder {
		header()
	}
	for r := range rows {
		s := ZMM()
		VMULPS_BCST(m.at(r, 0), d, s)
		f := ZMM()
		VCVTDQ2PS(is[r], f)
		VFMADD231PS(s, f, acc[r])
		VMULPS_BCST(m.at(r, 0), dmin, s)
		VCVTDQ2PS(ms[r], f)
		VFNMADD231PS(s, f, acc[r])
	}
	x.advance(256)
	m.advance(metaKBytes)
	ADDQ(U32(p5Bytes), panel)
	DECQ(nb)
	JNE(LabelRef("block"))
	storeAccs(accp, acc)
}

// widenQ5KN emits the kernel that widens Q5_K panels of p5 into the pack
// kernel's (quantk.go's pk layout: a level byte each, the scales as int32,
// the mins as int16 pairs, d and dmin as f32), for products of more rows
// than make up for making the levels whole in every pass.
func widenQ5KN() {
	widenKernel("qwidenQ5_KNAVX512", "qwidenQ5_KNAVX512 widens nb super-blocks of a Q5_K panel that keeps its nibbles at src into a Q5_K panel of the pack kernel's layout at dst and prefetches as many bytes from pf (see asmgen).",
		p5Bytes, pkBytes, func() func(src, dst Register) {
			c0f := splat(0x0f0f0f0f)
			c10 := splat(0x10101010)
			return func(src, dst Register) {
				for p := range 4 {
					for t := range 8 {
						v := ZMM()
						VMOVDQU64(Mem{Base: src, Disp: p5Level(8*p + t)}, v)
						hi := fifthLevels(v, Mem{Base: src, Disp: p5Qh(t)}, p, c0f, c10)
						VMOVDQU64(v, Mem{Base: dst, Disp: pkLevels + 64*(8*(2*p)+t)})
						VMOVDQU64(hi, Mem{Base: dst, Disp: pkLevels + 64*(8*(2*p+1)+t)})
					}
				}
				widenHeaderK(src, dst, p5Header)
			}
		})
}
