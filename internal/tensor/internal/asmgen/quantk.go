package main

// The AVX-512 panels of the K-quants (Q4_K, Q5_K, Q6_K): their layouts and
// pack kernels, which unpack the 6-bit (Q6_K: 8-bit) sub-block scales and
// mins into vectors of 16 rows.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Panel layout of a Q4_K/Q5_K super-block (offsets in bytes): 64 vectors
// of levels (vector 8j+t: levels 4t..4t+3 of sub-block j of every row),
// the 8 sub-block scales as int32, the mins as 4 vectors of int16 pairs
// (min 2i in the low half, 2i+1 in the high half), then d and dmin as f32.
const (
	pkLevels = 0
	pkScales = 64 * 64
	pkMins   = pkScales + 8*64
	pkD      = pkMins + 4*64
	pkDmin   = pkD + 64
	pkBytes  = pkDmin + 64
)

// Panel layout of a Q6_K super-block: 64 vectors of levels (vector 4s+t:
// levels 4t..4t+3 of sub-block s of 16, as 0..63), the 16 scales as int32,
// the scales as 8 vectors of int16 pairs, then d as f32.
const (
	p6Levels = 0
	p6Scales = 64 * 64
	p6Pairs  = p6Scales + 16*64
	p6D      = p6Pairs + 8*64
	p6Bytes  = p6D + 64
)

// ternAorB is the VPTERNLOGD function (A & C) | B.
const ternAorB = 0xEC

// shifted returns v shifted left by n bits per dword (right for n < 0),
// or v itself for n = 0.
func shifted(v VecVirtual, n int) VecVirtual {
	if n == 0 {
		return v
	}
	t := ZMM()
	if n > 0 {
		VPSLLD(U8(n), v, t)
	} else {
		VPSRLD(U8(-n), v, t)
	}
	return t
}

// shiftedMem returns the vector at m shifted left by n bits per dword
// (right for n < 0, a plain load for n = 0).
func shiftedMem(m Mem, n int) VecVirtual {
	t := ZMM()
	switch {
	case n > 0:
		VPSLLD(U8(n), m, t)
	case n < 0:
		VPSRLD(U8(-n), m, t)
	default:
		VMOVDQU64(m, t)
	}
	return t
}

// stashed stores vs in the stack area at base and returns their addresses
// (the transposes need most registers, so long-lived vectors wait there).
func stashed(base Mem, vs []VecVirtual) []Mem {
	ms := make([]Mem, len(vs))
	for i, v := range vs {
		ms[i] = base.Offset(64 * i)
		VMOVDQU64(v, ms[i])
	}
	return ms
}

// kHeader is where a K-quant panel that keeps the nibbles holds its
// super-block's scales and mins as bytes and d and dmin as f16.
type kHeader struct{ scales, mins, d, dmin int }

// pnHeader is where a Q4_K panel that keeps the nibbles holds them.
var pnHeader = kHeader{scales: pnScales, mins: pnMins, d: pnD, dmin: pnDmin}

// packHeaderK unpacks d, dmin and the 6-bit scales and mins of a Q4_K or
// Q5_K super-block of 16 rows into the panel at dst, or with hdr into the
// header of a panel that keeps the nibbles.
func packHeaderK(r rows16, dst GPVirtual, c63 VecVirtual, hdr *kHeader) {
	nib := hdr != nil
	h := transpose16x4(r, 0) // d|dmin, scales 0-3, 4-7, 8-11
	hi := ZMM()
	VPSRLD(U8(16), h[0], hi)
	if nib {
		VPMOVDW(h[0], Mem{Base: dst, Disp: hdr.d})
		VPMOVDW(hi, Mem{Base: dst, Disp: hdr.dmin})
	} else {
		lo := YMM()
		VPMOVDW(h[0], lo)
		d := ZMM()
		VCVTPH2PS(lo, d)
		VMOVUPS(d, Mem{Base: dst, Disp: pkD})
		VPMOVDW(hi, lo)
		VCVTPH2PS(lo, d)
		VMOVUPS(d, Mem{Base: dst, Disp: pkDmin})
	}
	c0f := splat(0x0f)
	c30 := splat(0x30)
	six := func(j int, mins bool) VecVirtual {
		if j < 4 {
			src := h[1]
			if mins {
				src = h[2]
			}
			v := shifted(src, -8*j)
			if v == src {
				v = ZMM()
				VPANDD(c63, src, v)
			} else {
				VPANDD(c63, v, v)
			}
			return v
		}
		jj := j - 4
		// Low 4 bits from byte jj of scales 8-11 (low or high nibble),
		// high 2 bits from the top of byte jj of scales 0-3 or 4-7.
		lowSh := -8 * jj
		top := h[1]
		if mins {
			lowSh -= 4
			top = h[2]
		}
		a := shifted(h[3], lowSh)
		if a == h[3] {
			a = ZMM()
			VMOVDQA64(h[3], a)
		}
		b := shifted(top, -(8*jj + 2))
		VPANDD(c30, b, b)
		VPTERNLOGD(U8(ternAorB), c0f, b, a)
		return a
	}
	var mins [8]VecVirtual
	for j := range 8 {
		if nib {
			VPMOVDB(six(j, false), Mem{Base: dst, Disp: hdr.scales + 16*j})
		} else {
			VMOVDQU64(six(j, false), Mem{Base: dst, Disp: pkScales + 64*j})
		}
		mins[j] = six(j, true)
	}
	for i := range 4 {
		if nib {
			// Bytes 2r and 2r+1: min 2i and 2i+1 of row r.
			VPSLLD(U8(8), mins[2*i+1], mins[2*i+1])
			VPORD(mins[2*i+1], mins[2*i], mins[2*i])
			VPMOVDW(mins[2*i], Mem{Base: dst, Disp: hdr.mins + 32*i})
			continue
		}
		VPSLLD(U8(16), mins[2*i+1], mins[2*i+1])
		VPORD(mins[2*i+1], mins[2*i], mins[2*i])
		VMOVDQU64(mins[2*i], Mem{Base: dst, Disp: pkMins + 64*i})
	}
}

// packQ4K emits the pack kernel of Q4_K (or Q5_K with five), or with nib
// the one that packs them into panels that keep their nibbles (the layouts
// a model stores, quantkdot.go).
func packQ4K(five, nib bool) {
	name, bytes, qs, pb := "Q4_K", 144, 16, pkBytes
	if five {
		name, bytes, qs = "Q5_K", 176, 48
	}
	var hdr *kHeader
	switch {
	case five && nib:
		name, pb, hdr = "Q5_KN", p5Bytes, &p5Header
	case nib:
		name, pb, hdr = "Q4_KN", pnBytes, &pnHeader
	}
	fn := "qpack" + name + "AVX512"
	TEXT(fn, NOSPLIT, packSig)
	what := name + " super-blocks of 16 weight rows ldw bytes apart into a panel"
	if nib {
		what = name[:4] + " super-blocks of 16 weight rows ldw bytes apart into a panel that keeps their nibbles"
	}
	Doc(fmt.Sprintf("%s packs nb %s at dst and prefetches as many bytes from pf (see asmgen).", fn, what))
	w, L, nb, dst, pf := packArgs()
	r := newRows16(w, L)
	c0f := splat(0x0f0f0f0f)
	c63 := splat(63)
	var stash Mem
	if five && !nib {
		stash = AllocLocal(8 * 64)
	}
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	prefetchNext(pf, 16*bytes, true)
	packHeaderK(r, dst, c63, hdr)
	var qh []Mem
	var c10 VecVirtual
	switch {
	case five && nib:
		for t, v := range transpose16x8(r, 16) {
			VMOVDQU64(v, Mem{Base: dst, Disp: p5Qh(t)})
		}
	case five:
		t := transpose16x8(r, 16)
		qh = stashed(stash, t[:])
		c10 = splat(0x10101010)
	}
	for c := range 4 {
		lv := transpose16x8(r, qs+32*c)
		for t, v := range lv {
			if nib {
				off := pnLevels + 64*(8*c+t)
				if five {
					off = p5Level(8*c + t)
				}
				VMOVDQU64(v, Mem{Base: dst, Disp: off})
				continue
			}
			var hi VecVirtual
			if !five {
				hi = ZMM()
				VPSRLD(U8(4), v, hi)
				VPANDD(c0f, v, v)
				VPANDD(c0f, hi, hi)
			} else {
				hi = fifthLevels(v, qh[t], c, c0f, c10)
			}
			VMOVDQU64(v, Mem{Base: dst, Disp: pkLevels + 64*(8*(2*c)+t)})
			VMOVDQU64(hi, Mem{Base: dst, Disp: pkLevels + 64*(8*(2*c+1)+t)})
		}
	}
	r.advance(bytes)
	ADDQ(U32(pb), dst)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// fifthLevels turns v, a vector of Q5_K nibbles (the low ones sub-block
// 2c's levels, the high ones 2c+1's), into the low sub-block's 5-bit
// levels and returns the high one's, the fifth bits from the qh vector at
// qh: bit 2c of each byte for the low nibbles, bit 2c+1 for the high
// ones, moved to bit 4.
func fifthLevels(v VecVirtual, qh Mem, c int, c0f, c10 VecVirtual) VecVirtual {
	hi := ZMM()
	VPSRLD(U8(4), v, hi)
	b := shiftedMem(qh, 4-2*c)
	VPANDD(c10, b, b)
	VPTERNLOGD(U8(ternAorB), c0f, b, v)
	b2 := shiftedMem(qh, 3-2*c)
	VPANDD(c10, b2, b2)
	VPTERNLOGD(U8(ternAorB), c0f, b2, hi)
	return hi
}

// fifthLevelsMem is fifthLevels for the nibble vector at v: it returns the
// low and the high sub-block's 5-bit levels, reading the qh vector first
// (a panel places it before the nibbles, and a kernel that first touches
// its lines out of order reads less).
func fifthLevelsMem(v, qh Mem, c int, c0f, c10 VecVirtual) (lo, hi VecVirtual) {
	b := shiftedMem(qh, 4-2*c)
	VPANDD(c10, b, b)
	b2 := shiftedMem(qh, 3-2*c)
	VPANDD(c10, b2, b2)
	lo, hi = ZMM(), ZMM()
	VMOVDQU64(v, lo)
	VPSRLD(U8(4), v, hi)
	VPTERNLOGD(U8(ternAorB), c0f, b, lo)
	VPTERNLOGD(U8(ternAorB), c0f, b2, hi)
	return lo, hi
}

// packQ6K emits the pack kernel of Q6_K.
func packQ6K() {
	const bytes = 210
	TEXT("qpackQ6_KAVX512", NOSPLIT, packSig)
	Doc("qpackQ6_KAVX512 packs nb Q6_K super-blocks of 16 weight rows ldw bytes apart into a panel at dst and prefetches as many bytes from pf (see asmgen).")
	w, L, nb, dst, pf := packArgs()
	r := newRows16(w, L)
	idx := rowIndex(L)
	c0f := splat(0x0f0f0f0f)
	c30 := splat(0x30303030)
	cLo := splat(0xffff)
	stash := AllocLocal(8 * 64)
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	prefetchNext(pf, 16*bytes, true)
	// Scales: sign-extended int32 and int16 pairs; d from the top half
	// of the dword at 206 (scales 14, 15, then d).
	sc := transpose16x4(r, 192)
	var s32 [16]VecVirtual
	for i := range 4 {
		for k := range 4 {
			v := ZMM()
			if k < 3 {
				VPSLLD(U8(24-8*k), sc[i], v)
				VPSRAD(U8(24), v, v)
			} else {
				VPSRAD(U8(24), sc[i], v)
			}
			s32[4*i+k] = v
			VMOVDQU64(v, Mem{Base: dst, Disp: p6Scales + 64*(4*i+k)})
		}
	}
	for i := range 8 {
		VPSLLD(U8(16), s32[2*i+1], s32[2*i+1])
		VPTERNLOGD(U8(ternAorB), cLo, s32[2*i+1], s32[2*i])
		VMOVDQU64(s32[2*i], Mem{Base: dst, Disp: p6Pairs + 64*i})
	}
	VMOVUPS(gatherF16(r, idx, 206, true), Mem{Base: dst, Disp: p6D})
	for h := range 2 {
		t := transpose16x8(r, 128+32*h)
		qh := stashed(stash, t[:])
		for qq := range 2 {
			ql := transpose16x8(r, 64*h+32*qq)
			for t, v := range ql {
				// Quarter qq takes the low nibbles, quarter qq+2 the
				// high ones; their top bits are bits 2q, 2q+1 of qh.
				hi := ZMM()
				VPSRLD(U8(4), v, hi)
				for _, q := range []int{qq, qq + 2} {
					b := shiftedMem(qh[t], 4-2*q)
					VPANDD(c30, b, b)
					lv := v
					if q >= 2 {
						lv = hi
					}
					VPTERNLOGD(U8(ternAorB), c0f, b, lv)
					VMOVDQU64(lv, Mem{Base: dst, Disp: p6Levels + 64*(32*h+8*q+t)})
				}
			}
		}
	}
	r.advance(bytes)
	ADDQ(U32(p6Bytes), dst)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}
