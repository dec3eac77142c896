package main

// The AVX2 8-stream row kernel of Q4_K and Q5_K (row8Q4KAVX2) and the
// vector unpacking of a super-block's 6-bit scales and mins (k4Unpack) with
// its tables. What it shares with the other 8-stream kernels is in
// row8.go.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// row8Q4KAVX2 emits the AVX2 Q4_K (with five, Q5_K) row kernel of 8
// streams, one row each (rows s < 8 at w + s·lds), a super-block of all 8
// rows a step, as row8Q6KAVX2 does Q6_K. Per super-block:
//
//   - the 6-bit scales and mins of two rows at once (rows i and i + 4, one
//     per 128-bit half) unpacked by vector ops from the 16 bytes d, dmin,
//     scales: two VPSHUFBs gather the bytes each scale and min is made of,
//     a VPSRLVD, a VPSRLW, two ANDs and an OR put the bits in place (see
//     k4Unpack); the scales widened to words (Q4_K) or spread to (sc, sc)
//     word pairs (Q5_K) in a stack slot, the mins times the activation's
//     sums per 32 by VPMADDWD, reduced by one tree to the 8 rows' M in the
//     lanes of one vector; the d|dmin dwords of the 8 rows gathered by
//     unpacks into one vector;
//   - per row, the dot products (the levels times the activations by
//     VPMADDUBSW, times the scales by VPMADDWD: see dot), the 8 rows'
//     partial sums reduced to the 8 rows' I in the lanes of one vector;
//   - the definition's two chains per super-block, fma(I, d·dy) then
//     fma(−M, dmin·dy), in the lanes of one accumulator.
//
// No scratch, no phase 2, no GP work per row but the addresses. Like
// row8Q6KAVX2 it has no software prefetch: with the 8 streams spread over
// the cache sets (package tensor's row8Regions), prefetching every line of
// each row's super-block 512 bytes, 1 KiB or 2 KiB ahead made Q4_K, Q5_K
// and Q6_K 0–10%, 10–20% and 15–30% slower cold on one thread, and 4
// regions read two adjacent rows abreast (rows 4–7 the rows after 0–3)
// halved the rate (docs/performance-log.md, "K-quant single-stream decode:
// stream count and prefetch re-measured"). On the Zen 2, with the weights
// in L1, it runs at 22–24 GB/s against the two-phase kernel's 16 (Q4_K:
// 22 cycles a row's super-block, of which the dot products' 12 multiplies
// and ~35 other vector ops take most; unpacking the scales and mins ~12%).
func row8Q4KAVX2(five bool) {
	k := &rowKern{group: 4}
	nm, bytes, qs := "Q4_K", 144, 16
	if five {
		nm, bytes, qs = "Q5_K", 176, 48
	}
	name := "qrow8" + nm + "AVX2"
	TEXT(name, NOSPLIT, "func(w *byte, lds int, nb int, x *int8, meta *uint32, aux *uint32, out *float32)")
	Doc(fmt.Sprintf("%s computes 8 %s weight rows lds bytes apart times one activation row (see asmgen's rowstreams.go).", name, nm))
	c0f := k.splatY(0x0f0f0f0f)
	var c10 Op
	if five {
		var b []byte
		for range 32 {
			b = append(b, 0x10)
		}
		c10 = table("rowc10", b)
	}
	u := k4UnpackTables()
	w := Load(Param("w"), GP64()).(GPVirtual)
	lds := Load(Param("lds"), GP64()).(GPVirtual)
	rows := newRows8(w, lds)
	n := Load(Param("nb"), GP64()).(GPVirtual)
	x := Load(Param("x"), GP64()).(GPVirtual)
	meta := Load(Param("meta"), GP64()).(GPVirtual)
	aux := Load(Param("aux"), GP64()).(GPVirtual)
	// Stack: Q4_K's scale words (32 bytes per two rows: rows i and i + 4's
	// sc₀..sc₇) or Q5_K's scale pairs (64 bytes per two rows: rows i and
	// i + 4's (sc, sc) pairs of scales 0..3, then of 4..7), then −M as f32
	// and the products dmin·dy and d·dy of the super-block.
	sb := 128
	if five {
		sb = 256
	}
	stash := AllocLocal(sb + 96)
	wordAt := func(r, c int) Mem { return stash.Offset(32*(r%4) + 16*(r/4) + 4*c) }
	pairAt := func(r, j int) Mem {
		return stash.Offset(64*(r%4) + 32*(j/4) + 16*(r/4) + 4*(j%4))
	}
	negM, sM, sD := stash.Offset(sb), stash.Offset(sb+32), stash.Offset(sb+64)
	acc := ymmZero()
	Label("super")
	// The scales and mins of rows i and i + 4, and the 8 rows' d|dmin.
	bs := YMM()
	VBROADCASTI128(Mem{Base: meta, Disp: metaSums32}, bs)
	var mv [4]VecVirtual
	var dd [2]VecVirtual
	for p := range 2 {
		var hv [2]VecVirtual
		for h := range 2 {
			i := 2*p + h
			hv[h] = YMM()
			VMOVDQU(rows.at(i, 0), hv[h].AsX())
			VINSERTI128(U8(1), rows.at(i+4, 0), hv[h], hv[h])
			sc := k4Unpack(u, hv[h])
			if five {
				lo, hi := YMM(), YMM()
				VPSHUFB(u.pairLo, sc, lo)
				VPSHUFB(u.pairHi, sc, hi)
				VMOVDQU(lo, stash.Offset(64*i))
				VMOVDQU(hi, stash.Offset(64*i+32))
			} else {
				sw := YMM()
				VPSHUFB(u.scWords, sc, sw)
				VMOVDQU(sw, stash.Offset(32*i))
			}
			VPSHUFB(u.minWords, sc, sc)
			mv[i] = YMM()
			VPMADDWD(bs, sc, mv[i])
		}
		dd[p] = YMM()
		VPUNPCKLDQ(hv[1], hv[0], dd[p])
	}
	// dw: the 8 rows' d|dmin dwords, row s in lane s.
	dw := YMM()
	VPUNPCKLQDQ(dd[1], dd[0], dw)
	mt := tree4(mv[:], YMM)
	mf := YMM()
	VCVTDQ2PS(mt, mf)
	VXORPS(u.sign, mf, mf)
	VMOVUPS(mf, negM)
	// d₀..d₃ dmin₀..dmin₃ | d₄..d₇ dmin₄..dmin₇, then d₀..d₇ dmin₀..dmin₇.
	VPSHUFB(u.dSplit, dw, dw)
	VPERMQ(U8(0b11011000), dw, dw)
	dy := YMM()
	VBROADCASTSS(Mem{Base: aux}, dy)
	dm := YMM()
	VCVTPH2PS(k.extractHi(dw), dm)
	VMULPS(dy, dm, dm)
	VMOVUPS(dm, sM)
	sd := YMM()
	VCVTPH2PS(dw.AsX(), sd)
	VMULPS(dy, sd, sd)
	VMOVUPS(sd, sD)
	// The levels of row r times the activations and the scales: 8 dword
	// partial sums of I. Each sub-block's 16 int16 pair sums by
	// VPMADDUBSW; Q5_K's times their scale pair by VPMADDWD, one per
	// sub-block as rowQ4K does; Q4_K's of sub-blocks 2c and 2c + 1 first
	// summed two pairs to a word (at most 4·15·127 = 7,620: exact), the
	// first sub-block's in the low word of each dword, the other's in the
	// high (an unpack each way and a VPADDW), then one VPMADDWD by
	// (sc₂c, sc₂c₊₁) for both: 12 multiplies a row instead of 16, for 8
	// more shuffles; Q5_K, with 7 more shifts a row for its fifth bits,
	// ran 3% slower so, Q4_K 11% faster (docs/performance-log.md).
	dot := func(r int) VecVirtual {
		blk := func(d int) Mem { return rows.at(r, d) }
		var qh VecVirtual
		if five {
			qh = YMM()
			VMOVDQU(blk(16), qh)
		}
		var ac [2]VecVirtual
		for c := range 4 {
			lo, hi := YMM(), YMM()
			VMOVDQU(blk(qs+32*c), hi)
			VPAND(c0f, hi, lo)
			VPSRLW(U8(4), hi, hi)
			VPAND(c0f, hi, hi)
			var p [2]VecVirtual
			for h, v := range []VecVirtual{lo, hi} {
				if five {
					// Bit 2c + h of each qh byte to bit 4.
					f := YMM()
					switch n := 4 - 2*c - h; {
					case n > 0:
						VPSLLW(U8(n), qh, f)
					case n < 0:
						VPSRLW(U8(-n), qh, f)
					default:
						VMOVDQU(qh, f)
					}
					VPAND(c10, f, f)
					VPOR(f, v, v)
				}
				p[h] = YMM()
				VPMADDUBSW(Mem{Base: x, Disp: 64*c + 32*h}, v, p[h])
				if !five {
					continue
				}
				s := YMM()
				VPBROADCASTD(pairAt(r, 2*c+h), s)
				if c == 0 {
					ac[h] = YMM()
					VPMADDWD(s, p[h], ac[h])
				} else {
					VPMADDWD(s, p[h], p[h])
					VPADDD(p[h], ac[h], ac[h])
				}
			}
			if five {
				continue
			}
			l, hw := YMM(), YMM()
			VPUNPCKLWD(p[1], p[0], l)
			VPUNPCKHWD(p[1], p[0], hw)
			VPADDW(hw, l, l)
			s := YMM()
			VPBROADCASTD(wordAt(r, c), s)
			if c < 2 {
				ac[c] = YMM()
				VPMADDWD(s, l, ac[c])
			} else {
				VPMADDWD(s, l, l)
				VPADDD(l, ac[c%2], ac[c%2])
			}
		}
		VPADDD(ac[1], ac[0], ac[0])
		return ac[0]
	}
	// tree4's adds, each pair of rows as soon as it is done (fewer live
	// registers: the Q5_K dot products need most of the 16).
	half := func(r0 int) VecVirtual {
		var a [2]VecVirtual
		for i := range 2 {
			z0 := dot(r0 + 2*i)
			z1 := dot(r0 + 2*i + 1)
			lo, hi := YMM(), YMM()
			VPUNPCKLDQ(z1, z0, lo)
			VPUNPCKHDQ(z1, z0, hi)
			VPADDD(hi, lo, lo)
			a[i] = lo
		}
		lo, hi := YMM(), YMM()
		VPUNPCKLQDQ(a[1], a[0], lo)
		VPUNPCKHQDQ(a[1], a[0], hi)
		VPADDD(hi, lo, lo)
		return lo
	}
	lo := half(0)
	hi := half(4)
	s := joinHalves(lo, hi)
	f := YMM()
	VCVTDQ2PS(s, f)
	VFMADD231PS(sD, f, acc)
	m := YMM()
	VMOVUPS(negM, m)
	VFMADD231PS(sM, m, acc)
	nextSuperBlock(rows, bytes, x, meta, aux, n)
	storeRows8(acc)
}

// k4Tables holds the tables of k4Unpack and row8Q4KAVX2.
type k4Tables struct {
	// idxL, idxH, shr, maskL, mask30: k4Unpack's (per 128-bit half).
	idxL, idxH, shr, maskL, mask30 Mem
	// pairLo and pairHi spread scales 0..3 and 4..7 to (sc, sc) word
	// pairs, scWords widens the scales to words, minWords the mins; dSplit splits 4 d|dmin dwords
	// into d₀..d₃, dmin₀..dmin₃; sign is the f32 sign bit.
	pairLo, pairHi, scWords, minWords, dSplit, sign Mem
}

// k4UnpackTables emits the tables of k4Unpack and row8Q4KAVX2.
func k4UnpackTables() k4Tables {
	const z = 0x80
	dup := func(b []byte) []byte { return append(b, b...) }
	// Byte k of the result (scale k < 8, min k − 8) from the bytes of
	// the scales field (scales[i] at 4 + i of the super-block): L holds
	// the byte of its low bits, H that of its high two bits (scales and
	// mins 4..7 only).
	l := []byte{4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15}
	h := []byte{z, z, z, z, 4, 5, 6, 7, z, z, z, z, 8, 9, 10, 11}
	shr := []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0}
	var maskL, mask30, pairLo, pairHi, scWords, minWords []byte
	for k := range 16 {
		if k/4%2 == 0 {
			maskL = append(maskL, 0x3f)
		} else {
			maskL = append(maskL, 0x0f)
		}
		mask30 = append(mask30, 0x30)
	}
	for j := range 4 {
		pairLo = append(pairLo, byte(j), z, byte(j), z)
		pairHi = append(pairHi, byte(4+j), z, byte(4+j), z)
	}
	for j := range 8 {
		scWords = append(scWords, byte(j), z)
		minWords = append(minWords, byte(8+j), z)
	}
	var sign []byte
	for range 8 {
		sign = append(sign, 0, 0, 0, 0x80)
	}
	return k4Tables{
		idxL:     table("k4unpackl", dup(l)),
		idxH:     table("k4unpackh", dup(h)),
		shr:      table("k4unpackshr", dup(shr)),
		maskL:    table("k4unpackmask", dup(maskL)),
		mask30:   table("k4unpack30", dup(mask30)),
		pairLo:   table("k4pairlo", dup(pairLo)),
		pairHi:   table("k4pairhi", dup(pairHi)),
		scWords:  table("k4scwords", dup(scWords)),
		minWords: table("k4minwords", dup(minWords)),
		dSplit:   table("k4dsplit", dup([]byte{0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15})),
		sign:     table("f32sign8", sign),
	}
}

// k4Unpack unpacks the 6-bit scales and mins of a Q4_K/Q5_K super-block
// in each 128-bit half of hv (its first 16 bytes: d, dmin, the 12 bytes of
// scales): byte k < 8 of a half of the result is scale k, byte 8 + k min
// k. Scales and mins 0..3 are the low 6 bits of scales[0..3] and [4..7];
// scales 4..7 the low nibbles of scales[8..11] with the top two bits of
// scales[0..3] above, mins 4..7 the high nibbles with those of
// scales[4..7] (ggml's packing; unpackScalesK4 does it in GP registers).
func k4Unpack(u k4Tables, hv VecVirtual) VecVirtual {
	l, h := YMM(), YMM()
	VPSHUFB(u.idxL, hv, l)
	VPSHUFB(u.idxH, hv, h)
	VPSRLVD(u.shr, l, l)
	VPAND(u.maskL, l, l)
	VPSRLW(U8(2), h, h)
	VPAND(u.mask30, h, h)
	VPOR(h, l, l)
	return l
}
