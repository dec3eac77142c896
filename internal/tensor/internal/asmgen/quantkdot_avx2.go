package main

// The AVX2 dot kernels of the K-quant panels (quantk_avx2.go), one family
// per dtype.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// kDotAVX2 describes one AVX2 K-quant dot kernel family.
type kDotAVX2 struct {
	name string
	// sub is the sub-block's weights, subs the sub-blocks of a
	// super-block.
	sub, subs int
	// maxLevel is the largest unsigned weight level.
	maxLevel int
	six      bool
}

var (
	kDotQ4K = kDotAVX2{"qdotKAVX2", 32, 8, 15, false}
	kDotQ5K = kDotAVX2{"qdot5KAVX2", 32, 8, 31, false}
	kDotQ6K = kDotAVX2{"qdot6KAVX2", 16, 16, 63, true}
)

// dotKAVX2 emits the AVX2 dot kernel of Q4_K/Q5_K panels (or Q6_K ones),
// computing what dotK does: per sub-block and activation row, a group of
// VPMADDUBSW results summed with VPADDW (exact, see int16Group), then
// one VPMADDWD by the scales (each of a lane's two int16 sums times the
// scale, the two added in int32) into the row's int32 total. That is one
// multiply instruction per 32 weight × activation products plus one per
// group, where widening each VPMADDUBSW result by its own VPMADDWD and
// scaling with VPMULLD (two uops) took two per 32 products plus two per
// sub-block; Zen 2 runs integer multiplies on one pipe, which bounds this
// kernel. The chains
// acc live in memory (a load and a store per super-block) so that four
// activation rows fit the 16 registers.
func dotKAVX2(kd kDotAVX2, rows int) {
	name := fmt.Sprintf("%sR%d", kd.name, rows)
	pb, scOff, pairs, pairOff, sumOff, dOff := pk8Bytes, pk8Scales, 4, pk8Mins, metaSums32, pk8D
	if kd.six {
		pb, scOff, pairs, pairOff, sumOff, dOff = p68Bytes, p68Scales, 8, p68Pairs, metaSums16, p68D
	}
	TEXT(name, NOSPLIT, dotSig)
	Doc(fmt.Sprintf("%s continues the 8-lane f32 chains of %d activation rows over nb super-blocks of a panel (see asmgen).", name, rows))
	x, m, panel, nb, accp := dotArgs(rows)
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	is := make([]VecVirtual, rows)
	steps := kd.sub / 4
	group := int16Group(kd.maxLevel, steps)
	for j := range kd.subs {
		for g0 := 0; g0 < steps; g0 += group {
			s16 := make([]VecVirtual, rows)
			for t := g0; t < g0+group; t++ {
				v := YMM()
				VMOVDQU(Mem{Base: panel, Disp: 32 * (steps*j + t)}, v)
				for r := range rows {
					xb := YMM()
					VPBROADCASTD(x.at(r, kd.sub*j+4*t), xb)
					VPMADDUBSW(xb, v, xb)
					if t == g0 {
						s16[r] = xb
						continue
					}
					VPADDW(xb, s16[r], s16[r])
				}
			}
			for r := range rows {
				VPMADDWD(Mem{Base: panel, Disp: scOff + 32*j}, s16[r], s16[r])
				if j == 0 && g0 == 0 {
					is[r] = s16[r]
					continue
				}
				VPADDD(s16[r], is[r], is[r])
			}
		}
	}
	ms := make([]VecVirtual, rows)
	for i := range pairs {
		v := YMM()
		VMOVDQU(Mem{Base: panel, Disp: pairOff + 32*i}, v)
		for r := range rows {
			b := YMM()
			VPBROADCASTD(m.at(r, sumOff+4*i), b)
			VPMADDWD(v, b, b)
			if i == 0 {
				ms[r] = b
				continue
			}
			VPADDD(b, ms[r], ms[r])
		}
	}
	for r := range rows {
		if kd.six {
			VPSLLD(U8(5), ms[r], ms[r])
			VPSUBD(ms[r], is[r], is[r])
		}
		acc := YMM()
		VMOVUPS(Mem{Base: accp, Disp: 32 * r}, acc)
		s := YMM()
		VBROADCASTSS(m.at(r, 0), s)
		d := YMM()
		VMULPS(Mem{Base: panel, Disp: dOff}, s, d)
		f := YMM()
		VCVTDQ2PS(is[r], f)
		VFMADD231PS(d, f, acc)
		if !kd.six {
			VMULPS(Mem{Base: panel, Disp: pk8Dmin}, s, d)
			VCVTDQ2PS(ms[r], f)
			VFNMADD231PS(d, f, acc)
		}
		VMOVUPS(acc, Mem{Base: accp, Disp: 32 * r})
	}
	x.advance(256)
	m.advance(metaKBytes)
	ADDQ(U32(pb), panel)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}
