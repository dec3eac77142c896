package main

// The AVX2 pack kernels of the K-quants (Q4_K, Q5_K, Q6_K).

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

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
	w, L, nb, dst, pf := packArgs()
	r := newRows8(w, L)
	stash := AllocLocal(8 * 32)
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	prefetchNext(pf, 8*bytes, false)
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
	w, L, nb, dst, pf := packArgs()
	r := newRows8(w, L)
	idx := rowIndex8(L)
	stash := AllocLocal(8 * 32)
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	prefetchNext(pf, 8*bytes, false)
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
