package main

// The AVX-512 dot kernel of the K-quant panels (quantk.go) and the layout
// of the K-quant activation metadata it reads.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// maxDotKRows is the largest number of activation rows one K-quant dot
// kernel takes.
const maxDotKRows = 6

// K-quant activation metadata per super-block (bytes): the f32 scale, the
// int16 sums of 32 as pairs, the int16 sums of 16 as pairs.
const (
	metaKBytes = 64
	metaSums32 = 16
	metaSums16 = 32
)

// kPanel is one of the K-quant panel layouts a dot kernel reads.
type kPanel int

const (
	panelQ4K  kPanel = iota // Q4_K/Q5_K levels unpacked to bytes (quantk.go)
	panelQ6K                // Q6_K levels unpacked to bytes (quantk.go)
	panelQ4KN               // Q4_K with its nibbles kept (below)
)

// Panel layout of a Q4_K super-block of 16 rows with its nibbles kept, as
// a model stores its Q4_K matrices (package tensor's PackPanels), 2.8% more
// than ggml's blocks: 32 vectors of levels (vector 8p+t: byte 4r+i holds
// ggml's qs[32p+4t+i] of row r, whose low nibble is level 4t+i of
// sub-block 2p and high nibble that of sub-block 2p+1), the 8 sub-block
// scales as bytes (16 per sub-block, one a row), the mins as bytes in
// pairs (32 per pair i: min 2i and 2i+1 of row r at bytes 2r and 2r+1),
// then d and dmin as f16 (16 each).
const (
	pnLevels = 0
	pnScales = 32 * 64
	pnMins   = pnScales + 8*16
	pnD      = pnMins + 4*32
	pnDmin   = pnD + 32
	pnBytes  = pnDmin + 32
)

// pendingRows is the most activation rows for which the Q4_K panel's dot
// kernel holds all 8 sub-blocks' sums until the super-block's scales.
const pendingRows = 2

// dotK emits the dot kernel for rows activation rows and panels of kind
// pk: per super-block and row, the exact I (Σ scale·Σ q·x) and M (Σ
// min·Σ x, or for Q6_K the offset term), then acc = fma(float(I), d·dy,
// acc) and acc = fma(−float(M), dmin·dy, acc).
func dotK(rows int, pk kPanel) {
	six := pk == panelQ6K
	name := fmt.Sprintf("qdotKAVX512R%d", rows)
	what := "Q4_K/Q5_K panel"
	sub, subs, pb := 32, 8, pkBytes
	switch pk {
	case panelQ6K:
		name = fmt.Sprintf("qdot6KAVX512R%d", rows)
		what = "Q6_K panel"
		sub, subs, pb = 16, 16, p6Bytes
	case panelQ4KN:
		name = fmt.Sprintf("qdotK4NAVX512R%d", rows)
		what = "Q4_K panel with its nibbles kept"
		pb = pnBytes
	}
	TEXT(name, NOSPLIT, dotSig)
	Doc(fmt.Sprintf("%s continues the 16-lane f32 chains of %d activation rows over nb super-blocks of a %s (see asmgen).", name, rows, what))
	x, m, panel, nb, accp := dotArgs(rows)
	acc := loadAccs(accp, rows)
	var c0f VecVirtual
	if pk == panelQ4KN {
		c0f = splat(0x0f0f0f0f)
	}
	TESTQ(nb, nb)
	JE(LabelRef("store"))
	Label("block")
	is := make([]VecVirtual, rows)
	// scaled adds sub-block j's dot products ds, times its scales, to is.
	scaled := func(j int, ds []VecVirtual) {
		var sc Op
		switch pk {
		case panelQ4K:
			sc = Mem{Base: panel, Disp: pkScales + 64*j}
		case panelQ6K:
			sc = Mem{Base: panel, Disp: p6Scales + 64*j}
		default:
			z := ZMM()
			VPMOVZXBD(Mem{Base: panel, Disp: pnScales + 16*j}, z)
			sc = z
		}
		for r := range rows {
			if j == 0 {
				is[r] = ZMM()
				VPMULLD(sc, ds[r], is[r])
				continue
			}
			VPMULLD(sc, ds[r], ds[r])
			VPADDD(ds[r], is[r], is[r])
		}
	}
	zeroed := func() []VecVirtual {
		ds := make([]VecVirtual, rows)
		for r := range rows {
			ds[r] = ZMM()
			VXORPS(ds[r], ds[r], ds[r]) // avo knows this zeroing idiom
		}
		return ds
	}
	if pk == panelQ4KN {
		// A vector of nibbles holds 4 levels of two sub-blocks: the low
		// nibbles sub-block 2p's, the high ones 2p+1's.
		finish := func(p int, lo, hi []VecVirtual) {
			for r := range rows {
				VPSRAD(U8(4), hi[r], hi[r]) // exact: a multiple of 16
			}
			scaled(2*p, lo)
			scaled(2*p+1, hi)
		}
		// One or two activation rows (decode) read the super-block's
		// lines in order, the scales after all the levels: reading them
		// between the levels costs a tenth of the read (the hardware
		// prefetchers follow ascending lines). More rows have no
		// registers for that.
		var pending [][2][]VecVirtual
		for p := range 4 {
			lo, hi := zeroed(), zeroed()
			for t := range 8 {
				// Each half by one instruction that loads the vector
				// (the line's second read hits L1), the high half as 16
				// times its nibbles: fewer instructions than a load, a
				// shift and two masks, though it measured alike.
				v := Mem{Base: panel, Disp: pnLevels + 64*(8*p+t)}
				l, h := ZMM(), ZMM()
				VPANDD(v, c0f, l)
				VPANDND(v, c0f, h)
				for r := range rows {
					vpdpbusd(x.at(r, 64*p+4*t), l, lo[r], true)
					vpdpbusd(x.at(r, 64*p+32+4*t), h, hi[r], true)
				}
			}
			if rows <= pendingRows {
				pending = append(pending, [2][]VecVirtual{lo, hi})
				continue
			}
			finish(p, lo, hi)
		}
		for p, lh := range pending {
			finish(p, lh[0], lh[1])
		}
	} else {
		for j := range subs {
			ds := zeroed()
			for t := range sub / 4 {
				v := ZMM()
				VMOVDQU64(Mem{Base: panel, Disp: 64 * (sub/4*j + t)}, v)
				for r := range rows {
					vpdpbusd(x.at(r, sub*j+4*t), v, ds[r], true)
				}
			}
			scaled(j, ds)
		}
	}
	// The second integer: Σ min·(Σ x per 32) from int16 pairs, or for
	// Q6_K Σ scale·(Σ x per 16), whose 32-fold is subtracted from I.
	ms := zeroed()
	pairs, sumOff := 4, metaSums32
	if six {
		pairs, sumOff = 8, metaSums16
	}
	for i := range pairs {
		v := ZMM()
		switch pk {
		case panelQ4K:
			VMOVDQU64(Mem{Base: panel, Disp: pkMins + 64*i}, v)
		case panelQ6K:
			VMOVDQU64(Mem{Base: panel, Disp: p6Pairs + 64*i}, v)
		default:
			VPMOVZXBW(Mem{Base: panel, Disp: pnMins + 32*i}, v)
		}
		for r := range rows {
			vpdpwssd(m.at(r, sumOff+4*i), v, ms[r], true)
		}
	}
	d := ZMM()
	var dmin VecVirtual
	switch pk {
	case panelQ4K:
		dmin = ZMM()
		VMOVUPS(Mem{Base: panel, Disp: pkD}, d)
		VMOVUPS(Mem{Base: panel, Disp: pkDmin}, dmin)
	case panelQ6K:
		VMOVUPS(Mem{Base: panel, Disp: p6D}, d)
	default:
		dmin = ZMM()
		VCVTPH2PS(Mem{Base: panel, Disp: pnD}, d)
		VCVTPH2PS(Mem{Base: panel, Disp: pnDmin}, dmin)
	}
	for r := range rows {
		if six {
			VPSLLD(U8(5), ms[r], ms[r])
			VPSUBD(ms[r], is[r], is[r])
		}
		s := ZMM()
		VMULPS_BCST(m.at(r, 0), d, s)
		f := ZMM()
		VCVTDQ2PS(is[r], f)
		VFMADD231PS(s, f, acc[r])
		if !six {
			VMULPS_BCST(m.at(r, 0), dmin, s)
			VCVTDQ2PS(ms[r], f)
			VFNMADD231PS(s, f, acc[r])
		}
	}
	x.advance(256)
	m.advance(metaKBytes)
	ADDQ(U32(pb), panel)
	DECQ(nb)
	JNE(LabelRef("block"))
	storeAccs(accp, acc)
}

// widenQ4KN emits the kernel that widens Q4_K panels that keep their
// nibbles (pn) into the pack kernel's layout (pk: a level byte each, the
// scales as int32, the mins as int16 pairs, d and dmin as f32), for the
// AMX kernel (qamxKR16), which multiplies level bytes.
func widenQ4KN() {
	widenKernel("qwidenQ4_KNAVX512", "qwidenQ4_KNAVX512 widens nb super-blocks of a Q4_K panel that keeps its nibbles at src into a Q4_K panel of the pack kernel's layout at dst and prefetches as many bytes from pf (see asmgen).",
		pnBytes, pkBytes, func() func(src, dst Register) {
			c0f := splat(0x0f0f0f0f)
			return func(src, dst Register) {
				for p := range 4 {
					for t := range 8 {
						v := ZMM()
						VMOVDQU64(Mem{Base: src, Disp: pnLevels + 64*(8*p+t)}, v)
						hi := ZMM()
						VPSRLD(U8(4), v, hi)
						VPANDD(c0f, v, v)
						VPANDD(c0f, hi, hi)
						VMOVDQU64(v, Mem{Base: dst, Disp: pkLevels + 64*(8*(2*p)+t)})
						VMOVDQU64(hi, Mem{Base: dst, Disp: pkLevels + 64*(8*(2*p+1)+t)})
					}
				}
				widenHeaderK(src, dst, pnHeader)
			}
		})
}

// widenHeaderK writes the header of a K-quant panel that keeps its nibbles
// (at src, where h says: scales as bytes, mins as byte pairs, d and dmin as
// f16) as the pack kernel's pk layout holds it at dst: the scales as
// int32, the mins as int16 pairs (bytes 2r, 2r+1, min 2i and 2i+1 of row
// r, to a pair), d and dmin as f32.
func widenHeaderK(src, dst Register, h kHeader) {
	for j := range 8 {
		v := ZMM()
		VPMOVZXBD(Mem{Base: src, Disp: h.scales + 16*j}, v)
		VMOVDQU64(v, Mem{Base: dst, Disp: pkScales + 64*j})
	}
	for i := range 4 {
		v := ZMM()
		VPMOVZXBW(Mem{Base: src, Disp: h.mins + 32*i}, v)
		VMOVDQU64(v, Mem{Base: dst, Disp: pkMins + 64*i})
	}
	for _, o := range [][2]int{{h.d, pkD}, {h.dmin, pkDmin}} {
		v := ZMM()
		VCVTPH2PS(Mem{Base: src, Disp: o[0]}, v)
		VMOVUPS(v, Mem{Base: dst, Disp: o[1]})
	}
}
