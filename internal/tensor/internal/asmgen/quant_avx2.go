package main

// The AVX2 quantized kernels: the same panel scheme as quant.go with 8
// weight rows in the 8 lanes of a YMM, and the integer dot products made
// with VPMADDUBSW (unsigned levels × signed activations, adjacent pairs
// summed to int16) and VPMADDWD by ones (pairs summed to int32). The
// int16 pair sums cannot saturate: the levels are at most 63 (Q6_K) and
// the activations at most 127 in magnitude, except Q8_0, whose signed
// levels go through the sign trick instead (|w| times x with w's sign), so
// the integers are exact and the results those of the definition. Only the
// 16 YMM registers of AVX2 are used, and only VEX encodings.

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// splat8 returns a YMM holding the dword v in every lane.
func splat8(v uint32) VecVirtual {
	g := GP32()
	MOVL(U32(v), g)
	x := XMM()
	VMOVD(g, x)
	y := YMM()
	VPBROADCASTD(x, y)
	return y
}

// rows8 addresses 8 rows L bytes apart: row l at bases[l/4] + (l%4)·L.
type rows8 struct {
	bases [2]GPVirtual
	L, L3 GPVirtual
}

func newRows8(base, L GPVirtual) rows8 {
	r := rows8{L: L, L3: GP64()}
	LEAQ(Mem{Base: L, Index: L, Scale: 2}, r.L3)
	r.bases[0] = base
	r.bases[1] = GP64()
	LEAQ(Mem{Base: base, Index: L, Scale: 4}, r.bases[1])
	return r
}

func (r rows8) at(l, disp int) Mem {
	m := Mem{Base: r.bases[l/4], Disp: disp}
	switch l % 4 {
	case 1:
		m.Index, m.Scale = r.L, 1
	case 2:
		m.Index, m.Scale = r.L, 2
	case 3:
		m.Index, m.Scale = r.L3, 1
	}
	return m
}

func (r rows8) advance(bytes int) {
	for _, b := range r.bases {
		ADDQ(U32(bytes), b)
	}
}

// transpose8x8 loads 8 dwords at disp of each of the 8 rows and returns
// t[i], whose lane l is dword i of row l.
func transpose8x8(r rows8, disp int) [8]VecVirtual {
	var b [2][4]VecVirtual
	for h := range 2 {
		var a [4]VecVirtual
		for p := range 2 {
			y0, y1 := YMM(), YMM()
			VMOVDQU(r.at(4*h+2*p, disp), y0)
			VMOVDQU(r.at(4*h+2*p+1, disp), y1)
			a[2*p], a[2*p+1] = YMM(), YMM()
			VPUNPCKLDQ(y1, y0, a[2*p])
			VPUNPCKHDQ(y1, y0, a[2*p+1])
		}
		for i := range 4 {
			b[h][i] = YMM()
		}
		VPUNPCKLQDQ(a[2], a[0], b[h][0])
		VPUNPCKHQDQ(a[2], a[0], b[h][1])
		VPUNPCKLQDQ(a[3], a[1], b[h][2])
		VPUNPCKHQDQ(a[3], a[1], b[h][3])
	}
	// b[h][i]: rows 4h..4h+3, dword i in the low 128 bits, 4+i in the high.
	var t [8]VecVirtual
	for i := range 4 {
		t[i], t[4+i] = YMM(), YMM()
		VPERM2I128(U8(0x20), b[1][i], b[0][i], t[i])
		VPERM2I128(U8(0x31), b[1][i], b[0][i], t[4+i])
	}
	return t
}

// transpose8x4 loads 4 dwords at disp of each of the 8 rows and returns
// t[i], whose lane l is dword i of row l.
func transpose8x4(r rows8, disp int) [4]VecVirtual {
	var z [4]VecVirtual
	for g := range 4 {
		z[g] = YMM()
		VBROADCASTI128(r.at(g, disp), z[g])
		VINSERTI128(U8(1), r.at(4+g, disp), z[g], z[g])
	}
	a := [4]VecVirtual{YMM(), YMM(), YMM(), YMM()}
	VPUNPCKLDQ(z[1], z[0], a[0])
	VPUNPCKHDQ(z[1], z[0], a[1])
	VPUNPCKLDQ(z[3], z[2], a[2])
	VPUNPCKHDQ(z[3], z[2], a[3])
	var t [4]VecVirtual
	for i := range t {
		t[i] = YMM()
	}
	VPUNPCKLQDQ(a[2], a[0], t[0])
	VPUNPCKHQDQ(a[2], a[0], t[1])
	VPUNPCKLQDQ(a[3], a[1], t[2])
	VPUNPCKHQDQ(a[3], a[1], t[3])
	return t
}

// halvesToF32 converts the f16 in the low halves of the dwords of v (the
// high halves zero) to 8 f32.
func halvesToF32(v VecVirtual) VecVirtual {
	p := YMM()
	VPACKUSDW(v, v, p)
	q := YMM()
	VPERMQ(U8(0x08), p, q)
	f := YMM()
	VCVTPH2PS(q.AsX(), f)
	return f
}

// gatherF16x8 returns the f16 at disp of each of the 8 rows widened to
// f32 (the dword from disp must be readable; with high the f16 is its top
// half).
func gatherF16x8(r rows8, idx, ones, lo16 VecVirtual, disp int, high bool) VecVirtual {
	mask := YMM()
	VMOVDQA(ones, mask)
	g := YMM()
	VXORPS(g, g, g)
	VPGATHERDD(mask, Mem{Base: r.bases[0], Index: idx, Scale: 1, Disp: disp}, g)
	if high {
		VPSRLD(U8(16), g, g)
	} else {
		VPAND(lo16, g, g)
	}
	return halvesToF32(g)
}

// rowIndex8 returns the gather index vector l·L for l < 8.
func rowIndex8(L GPVirtual) VecVirtual {
	x := XMM()
	VMOVD(L.As32(), x)
	b := YMM()
	VPBROADCASTD(x, b)
	idx := YMM()
	VPMULLD(iotaTable(), b, idx)
	return idx
}

// AVX2 panel layouts: those of quant.go with 32-byte vectors, except that
// the K-quants' sub-block scales hold the scale in both int16 halves of
// each lane (the factors of the dot kernels' VPMADDWD).
const (
	panel32Bytes8 = 32 * panel32Vecs
	pk8Scales     = 64 * 32
	pk8Mins       = pk8Scales + 8*32
	pk8D          = pk8Mins + 4*32
	pk8Dmin       = pk8D + 32
	pk8Bytes      = pk8Dmin + 32
	p68Scales     = 64 * 32
	p68Pairs      = p68Scales + 16*32
	p68D          = p68Pairs + 8*32
	p68Bytes      = p68D + 32
)

// pack32AVX2 emits the AVX2 pack kernel of Q8_0 (raw signed levels), Q4_0
// (nibbles) or Q5_0 (nibbles and fifth bits).
func pack32AVX2(q quant32) {
	name := "qpack" + q.name + "AVX2"
	TEXT(name, NOSPLIT, packSig)
	Doc(fmt.Sprintf("%s packs nb %s blocks of 8 weight rows ldw bytes apart into a panel at dst and prefetches as many bytes from pf (see asmgen).", name, q.name))
	w := Load(Param("w"), GP64()).(GPVirtual)
	L := Load(Param("ldw"), GP64()).(GPVirtual)
	nb := Load(Param("nb"), GP64())
	dst := Load(Param("dst"), GP64())
	pf := Load(Param("pf"), GP64()).(GPVirtual)
	r := newRows8(w, L)
	idx := rowIndex8(L)
	ones := splat8(0xffffffff)
	lo16 := splat8(0xffff)
	c0f := splat8(0x0f0f0f0f)
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	prefetchNext(pf, 8*q.bytes)
	switch q.bytes {
	case 34:
		for i, v := range transpose8x8(r, 2) {
			VMOVDQU(v, Mem{Base: dst, Disp: 32 * i})
		}
	case 22:
		// Q5_0: the fifth bits spread to bit 4 of each byte by a
		// multiplication (bit k of a nibble lands in byte k).
		mask := YMM()
		VMOVDQA(ones, mask)
		qh := YMM()
		VXORPS(qh, qh, qh)
		VPGATHERDD(mask, Mem{Base: r.bases[0], Index: idx, Scale: 1, Disp: 2}, qh)
		for i, v := range transpose8x4(r, 6) {
			hi := YMM()
			VPSRLD(U8(4), v, hi)
			VPAND(c0f, v, v)
			VPAND(c0f, hi, hi)
			for h, lv := range []VecVirtual{v, hi} {
				b := YMM()
				VPSRLD(U8(16*h+4*i), qh, b)
				VPAND(splat8(15), b, b)
				VPMULLD(splat8(0x00204081), b, b)
				VPAND(splat8(0x01010101), b, b)
				VPSLLD(U8(4), b, b)
				VPOR(b, lv, lv)
			}
			VMOVDQU(v, Mem{Base: dst, Disp: 32 * i})
			VMOVDQU(hi, Mem{Base: dst, Disp: 32 * (4 + i)})
		}
	default:
		for i, v := range transpose8x4(r, 2) {
			hi := YMM()
			VPSRLD(U8(4), v, hi)
			VPAND(c0f, v, v)
			VPAND(c0f, hi, hi)
			VMOVDQU(v, Mem{Base: dst, Disp: 32 * i})
			VMOVDQU(hi, Mem{Base: dst, Disp: 32 * (4 + i)})
		}
	}
	VMOVUPS(gatherF16x8(r, idx, ones, lo16, 0, false), Mem{Base: dst, Disp: 256})
	r.advance(q.bytes)
	ADDQ(U32(panel32Bytes8), dst)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// maxDot32RowsAVX2 and maxDotKRowsAVX2 bound the activation rows of one
// AVX2 dot kernel (16 registers).
const (
	maxDot32RowsAVX2 = 4
	maxDotKRowsAVX2  = 4
)

// dot32AVX2 emits the AVX2 dot kernel of 32-weight blocks: Q8_0 panels
// (signed levels, sign trick, no correction) for maxLevel 0, or Q4_0/Q5_0
// ones (unsigned levels ≤ maxLevel, 15 or 31, the correction from the
// metadata): a group of VPMADDUBSW results (see int16Group) is summed in
// int16 (VPADDW) before one VPMADDWD by ones widens it. Q8_0's pair sums
// reach 32,512, so each is widened alone.
func dot32AVX2(rows, maxLevel int) {
	name := fmt.Sprintf("qdotQ8_0AVX2R%d", rows)
	switch maxLevel {
	case 15:
		name = fmt.Sprintf("qdotQ4_0AVX2R%d", rows)
	case 31:
		name = fmt.Sprintf("qdotQ5_0AVX2R%d", rows)
	}
	unsigned := maxLevel > 0
	group := 1
	if unsigned {
		group = int16Group(maxLevel, 8)
	}
	TEXT(name, NOSPLIT, dotSig)
	Doc(fmt.Sprintf("%s continues the 8-lane f32 chains of %d activation rows over nb blocks of a panel (see asmgen).", name, rows))
	x := newActRows(Load(Param("x"), GP64()).(GPVirtual), Load(Param("ldx"), GP64()).(GPVirtual), rows)
	m := newActRows(Load(Param("meta"), GP64()).(GPVirtual), Load(Param("ldm"), GP64()).(GPVirtual), rows)
	panel := Load(Param("panel"), GP64())
	nb := Load(Param("nb"), GP64())
	accp := Load(Param("acc"), GP64())
	ones16 := splat8(0x00010001)
	acc := make([]VecVirtual, rows)
	for r := range acc {
		acc[r] = YMM()
		VMOVUPS(Mem{Base: accp, Disp: 32 * r}, acc[r])
	}
	TESTQ(nb, nb)
	JE(LabelRef("store"))
	Label("block")
	is := make([]VecVirtual, rows)
	for r := range is {
		is[r] = YMM()
		if unsigned {
			VPBROADCASTD(m.at(r, 4), is[r])
		} else {
			VXORPS(is[r], is[r], is[r])
		}
	}
	for g0 := 0; g0 < 8; g0 += group {
		s16 := make([]VecVirtual, rows)
		for t := g0; t < g0+group; t++ {
			v := YMM()
			VMOVDQU(Mem{Base: panel, Disp: 32 * t}, v)
			var av VecVirtual
			if !unsigned {
				av = YMM()
				VPABSB(v, av)
			}
			for r := range rows {
				xb := YMM()
				VPBROADCASTD(x.at(r, 4*t), xb)
				if unsigned {
					VPMADDUBSW(xb, v, xb)
				} else {
					VPSIGNB(v, xb, xb)
					VPMADDUBSW(xb, av, xb)
				}
				if t == g0 {
					s16[r] = xb
					continue
				}
				VPADDW(xb, s16[r], s16[r])
			}
		}
		for r := range rows {
			VPMADDWD(ones16, s16[r], s16[r])
			VPADDD(s16[r], is[r], is[r])
		}
	}
	dw := YMM()
	VMOVUPS(Mem{Base: panel, Disp: 256}, dw)
	for r := range rows {
		s := YMM()
		VBROADCASTSS(m.at(r, 0), s)
		VMULPS(dw, s, s)
		f := YMM()
		VCVTDQ2PS(is[r], f)
		VFMADD231PS(s, f, acc[r])
	}
	x.advance(32)
	m.advance(8)
	ADDQ(U32(panel32Bytes8), panel)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("store")
	for r := range acc {
		VMOVUPS(acc[r], Mem{Base: accp, Disp: 32 * r})
	}
	VZEROUPPER()
	RET()
}

// stash8 stores vs in the stack area at base and returns their addresses.
func stash8(base Mem, vs []VecVirtual) []Mem {
	ms := make([]Mem, len(vs))
	for i, v := range vs {
		ms[i] = base.Offset(32 * i)
		VMOVDQU(v, ms[i])
	}
	return ms
}

// loadShifted returns the vector at m shifted left by n bits per dword
// (right for n < 0).
func loadShifted(m Mem, n int) VecVirtual {
	t := YMM()
	VMOVDQU(m, t)
	switch {
	case n > 0:
		VPSLLD(U8(n), t, t)
	case n < 0:
		VPSRLD(U8(-n), t, t)
	}
	return t
}

// packQ4KAVX2 emits the AVX2 pack kernel of Q4_K (or Q5_K with five).
func packQ4KAVX2(five bool) {
	name, bytes, qs := "Q4_K", 144, 16
	if five {
		name, bytes, qs = "Q5_K", 176, 48
	}
	fn := "qpack" + name + "AVX2"
	TEXT(fn, NOSPLIT, packSig)
	Doc(fmt.Sprintf("%s packs nb %s super-blocks of 8 weight rows ldw bytes apart into a panel at dst and prefetches as many bytes from pf (see asmgen).", fn, name))
	w := Load(Param("w"), GP64()).(GPVirtual)
	L := Load(Param("ldw"), GP64()).(GPVirtual)
	nb := Load(Param("nb"), GP64())
	dst := Load(Param("dst"), GP64()).(GPVirtual)
	pf := Load(Param("pf"), GP64()).(GPVirtual)
	r := newRows8(w, L)
	stash := AllocLocal(8 * 32)
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	prefetchNext(pf, 8*bytes)
	// Header: d|dmin and the three dwords of scales per row.
	h := transpose8x4(r, 0)
	hs := stash8(stash, h[:])
	{
		lo16 := splat8(0xffff)
		d := YMM()
		VPAND(lo16, h[0], d)
		VMOVUPS(halvesToF32(d), Mem{Base: dst, Disp: pk8D})
		VPSRLD(U8(16), h[0], d)
		VMOVUPS(halvesToF32(d), Mem{Base: dst, Disp: pk8Dmin})
	}
	six := func(j int, mins bool) VecVirtual {
		if j < 4 {
			src := hs[1]
			if mins {
				src = hs[2]
			}
			v := loadShifted(src, -8*j)
			VPAND(splat8(63), v, v)
			return v
		}
		jj := j - 4
		lowSh, top := -8*jj, hs[1]
		if mins {
			lowSh, top = lowSh-4, hs[2]
		}
		a := loadShifted(hs[3], lowSh)
		VPAND(splat8(0x0f), a, a)
		b := loadShifted(top, -(8*jj + 2))
		VPAND(splat8(0x30), b, b)
		VPOR(b, a, a)
		return a
	}
	// The scales as two equal int16 per lane: VPMADDWD's factors for the
	// dot kernel's int16 sums.
	for j := range 8 {
		v := six(j, false)
		hi := YMM()
		VPSLLD(U8(16), v, hi)
		VPOR(hi, v, v)
		VMOVDQU(v, Mem{Base: dst, Disp: pk8Scales + 32*j})
	}
	for i := range 4 {
		lo, hi := six(2*i, true), six(2*i+1, true)
		VPSLLD(U8(16), hi, hi)
		VPOR(hi, lo, lo)
		VMOVDQU(lo, Mem{Base: dst, Disp: pk8Mins + 32*i})
	}
	var qh []Mem
	if five {
		t := transpose8x8(r, 16)
		qh = stash8(stash, t[:])
	}
	for c := range 4 {
		lv := transpose8x8(r, qs+32*c)
		for t, v := range lv {
			c0f := splat8(0x0f0f0f0f)
			hi := YMM()
			VPSRLD(U8(4), v, hi)
			VPAND(c0f, v, v)
			VPAND(c0f, hi, hi)
			if five {
				c10 := splat8(0x10101010)
				b := loadShifted(qh[t], 4-2*c)
				VPAND(c10, b, b)
				VPOR(b, v, v)
				b2 := loadShifted(qh[t], 3-2*c)
				VPAND(c10, b2, b2)
				VPOR(b2, hi, hi)
			}
			VMOVDQU(v, Mem{Base: dst, Disp: 32 * (8*(2*c) + t)})
			VMOVDQU(hi, Mem{Base: dst, Disp: 32 * (8*(2*c+1) + t)})
		}
	}
	r.advance(bytes)
	ADDQ(U32(pk8Bytes), dst)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// packQ6KAVX2 emits the AVX2 pack kernel of Q6_K.
func packQ6KAVX2() {
	const bytes = 210
	TEXT("qpackQ6_KAVX2", NOSPLIT, packSig)
	Doc("qpackQ6_KAVX2 packs nb Q6_K super-blocks of 8 weight rows ldw bytes apart into a panel at dst and prefetches as many bytes from pf (see asmgen).")
	w := Load(Param("w"), GP64()).(GPVirtual)
	L := Load(Param("ldw"), GP64()).(GPVirtual)
	nb := Load(Param("nb"), GP64())
	dst := Load(Param("dst"), GP64()).(GPVirtual)
	pf := Load(Param("pf"), GP64()).(GPVirtual)
	r := newRows8(w, L)
	idx := rowIndex8(L)
	stash := AllocLocal(8 * 32)
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	prefetchNext(pf, 8*bytes)
	sc := transpose8x4(r, 192)
	scs := stash8(stash, sc[:])
	var pairLo VecVirtual
	for s := range 16 {
		v := YMM()
		VMOVDQU(scs[s/4], v)
		if k := s % 4; k < 3 {
			VPSLLD(U8(24-8*k), v, v)
		}
		VPSRAD(U8(24), v, v)
		// The scale as two equal int16 per lane (VPMADDWD's factors).
		dup := YMM()
		VPSLLD(U8(16), v, dup)
		lo := YMM()
		VPAND(splat8(0xffff), v, lo)
		VPOR(lo, dup, dup)
		VMOVDQU(dup, Mem{Base: dst, Disp: p68Scales + 32*s})
		if s%2 == 0 {
			pairLo = v
			VPAND(splat8(0xffff), pairLo, pairLo)
			continue
		}
		VPSLLD(U8(16), v, v)
		VPOR(v, pairLo, pairLo)
		VMOVDQU(pairLo, Mem{Base: dst, Disp: p68Pairs + 32*(s/2)})
	}
	{
		ones := splat8(0xffffffff)
		VMOVUPS(gatherF16x8(r, idx, ones, ones, 206, true), Mem{Base: dst, Disp: p68D})
	}
	for h := range 2 {
		t := transpose8x8(r, 128+32*h)
		qh := stash8(stash, t[:])
		for qq := range 2 {
			ql := transpose8x8(r, 64*h+32*qq)
			for t, v := range ql {
				c0f := splat8(0x0f0f0f0f)
				c30 := splat8(0x30303030)
				hi := YMM()
				VPSRLD(U8(4), v, hi)
				for _, q := range []int{qq, qq + 2} {
					lv := v
					if q >= 2 {
						lv = hi
					}
					VPAND(c0f, lv, lv)
					b := loadShifted(qh[t], 4-2*q)
					VPAND(c30, b, b)
					VPOR(b, lv, lv)
					VMOVDQU(lv, Mem{Base: dst, Disp: 32 * (32*h + 8*q + t)})
				}
			}
		}
	}
	r.advance(bytes)
	ADDQ(U32(p68Bytes), dst)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

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

// int16Group returns how many VPMADDUBSW results (pair sums of an unsigned
// level ≤ maxLevel times an activation in [−127, 127]) a kernel sums in
// int16 before widening them: the most, dividing the steps of a block or
// sub-block, whose total stays within int16 for every input. A pair sum is
// at most 2·127·maxLevel in magnitude: Q4_K/Q4_0 (15) 3,810, so 8 (30,480);
// Q5_K/Q5_0 (31) 7,874, so 4 (31,496); Q6_K (63) 16,002, so 2 (32,004).
func int16Group(maxLevel, steps int) int {
	g := steps
	for g > 1 && (steps%g != 0 || g*2*127*maxLevel > math.MaxInt16) {
		g--
	}
	return g
}

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
	x := newActRows(Load(Param("x"), GP64()).(GPVirtual), Load(Param("ldx"), GP64()).(GPVirtual), rows)
	m := newActRows(Load(Param("meta"), GP64()).(GPVirtual), Load(Param("ldm"), GP64()).(GPVirtual), rows)
	panel := Load(Param("panel"), GP64())
	nb := Load(Param("nb"), GP64())
	accp := Load(Param("acc"), GP64())
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

// quantKernelsAVX2 emits the AVX2 quantized matrix kernels.
func quantKernelsAVX2() {
	pack32AVX2(quant32{"Q8_0", 34})
	pack32AVX2(quant32{"Q4_0", 18})
	pack32AVX2(quant32{"Q5_0", 22})
	for r := 1; r <= maxDot32RowsAVX2; r++ {
		for _, maxLevel := range []int{0, 15, 31} {
			dot32AVX2(r, maxLevel)
		}
	}
	packQ4KAVX2(false)
	packQ4KAVX2(true)
	packQ6KAVX2()
	for _, kd := range []kDotAVX2{kDotQ4K, kDotQ5K, kDotQ6K} {
		for r := 1; r <= maxDotKRowsAVX2; r++ {
			dotKAVX2(kd, r)
		}
	}
}

// evexOnly matches what an AVX2 CPU cannot run: registers 16-31, ZMM and
// mask registers, and EVEX-only instructions.
var evexOnly = regexp.MustCompile(`\b([XY](1[6-9]|2[0-9]|3[01])|Z[0-9]+|K[0-7])\b|\.BCST|VPTERNLOG|VPMOV[DQ][BW]|VMOVDQ[AU](32|64)|VP(AND|OR|XOR)[DQ]\b|VSHUF[IF](32|64)|VPDPB|VPDPW|KXNOR`)

// checkVEXOnly fails if a quantized AVX2 kernel in the assembly at path
// uses something only AVX-512 has (the register allocator may pick
// registers 16-31 if a kernel needs more than 16).
func checkVEXOnly(path string) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	fn := ""
	for n, line := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(line, "TEXT ") {
			fn = line
		}
		if strings.Contains(fn, "AVX2") && strings.HasPrefix(fn, "TEXT ·q") && evexOnly.MatchString(line) {
			return fmt.Errorf("%s:%d: AVX2 kernel needs AVX-512: %s", path, n+1, strings.TrimSpace(line))
		}
	}
	return nil
}
