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

// dotK emits the dot kernel for rows activation rows and panels of
// Q4_K/Q5_K super-blocks (or Q6_K ones with six): per super-block and row,
// the exact I (Σ scale·Σ q·x) and M (Σ min·Σ x, or for Q6_K the offset
// term), then acc = fma(float(I), d·dy, acc) and acc = fma(−float(M),
// dmin·dy, acc).
func dotK(rows int, six bool) {
	name := fmt.Sprintf("qdotKAVX512R%d", rows)
	what := "Q4_K/Q5_K"
	sub, subs, pb := 32, 8, pkBytes
	if six {
		name = fmt.Sprintf("qdot6KAVX512R%d", rows)
		what = "Q6_K"
		sub, subs, pb = 16, 16, p6Bytes
	}
	TEXT(name, NOSPLIT, dotSig)
	Doc(fmt.Sprintf("%s continues the 16-lane f32 chains of %d activation rows over nb super-blocks of a %s panel (see asmgen).", name, rows, what))
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
	for j := range subs {
		ds := make([]VecVirtual, rows)
		for r := range rows {
			ds[r] = ZMM()
			VXORPS(ds[r], ds[r], ds[r]) // avo knows this zeroing idiom
		}
		for t := range sub / 4 {
			v := ZMM()
			VMOVDQU64(Mem{Base: panel, Disp: 64 * (sub/4*j + t)}, v)
			for r := range rows {
				vpdpbusd(x.at(r, sub*j+4*t), v, ds[r], true)
			}
		}
		scOff := pkScales
		if six {
			scOff = p6Scales
		}
		for r := range rows {
			if j == 0 {
				is[r] = ZMM()
				VPMULLD(Mem{Base: panel, Disp: scOff + 64*j}, ds[r], is[r])
				continue
			}
			VPMULLD(Mem{Base: panel, Disp: scOff + 64*j}, ds[r], ds[r])
			VPADDD(ds[r], is[r], is[r])
		}
	}
	// The second integer: Σ min·(Σ x per 32) from int16 pairs, or for
	// Q6_K Σ scale·(Σ x per 16), whose 32-fold is subtracted from I.
	ms := make([]VecVirtual, rows)
	for r := range rows {
		ms[r] = ZMM()
		VXORPS(ms[r], ms[r], ms[r])
	}
	pairs, pairOff, sumOff := 4, pkMins, metaSums32
	if six {
		pairs, pairOff, sumOff = 8, p6Pairs, metaSums16
	}
	for i := range pairs {
		v := ZMM()
		VMOVDQU64(Mem{Base: panel, Disp: pairOff + 64*i}, v)
		for r := range rows {
			vpdpwssd(m.at(r, sumOff+4*i), v, ms[r], true)
		}
	}
	dOff := pkD
	if six {
		dOff = p6D
	}
	d := ZMM()
	VMOVUPS(Mem{Base: panel, Disp: dOff}, d)
	var dmin VecVirtual
	if !six {
		dmin = ZMM()
		VMOVUPS(Mem{Base: panel, Disp: pkDmin}, dmin)
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
	Label("store")
	for r := range acc {
		VMOVUPS(acc[r], Mem{Base: accp, Disp: 64 * r})
	}
	VZEROUPPER()
	RET()
}
