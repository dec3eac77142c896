package main

// The Q4_K and Q5_K row kernel rowQ4K (emitted for AVX2; the AVX-512 one is
// rowQ4K512, in rowk512.go) and the unpacking of a super-block's 6-bit
// scales and mins in GP registers.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// rowQ4K emits the Q4_K (or, with five, Q5_K) row kernel. Per super-block
// the 6-bit scales and mins are unpacked in GP registers, the scales
// spread to int16 pairs in a stack slot; the levels (nibbles, with Q5_K
// the fifth bits from qh) times the activations by VPMADDUBSW (exact: at
// most 31·127·2 per pair), times the scales by VPDPWSSD (VPMADDWD and
// VPADDD on AVX2); the mins times the activation sums per 32 by VPMADDWD.
// I (8 lanes folded to 4) and M (4 lanes) of 4 super-blocks share one
// tree: its result is I₀..I₃, M₀..M₃.
func rowQ4K(avx512, five bool) {
	k := &rowKern{avx512: avx512, group: 4, pairs: 2}
	k.setStreams(rowStreamsKAVX2)
	nm, bytes, qs := "Q4_K", 144, 16
	if five {
		nm, bytes, qs = "Q5_K", 176, 48
	}
	name := "qrow" + nm + k.isaName()
	TEXT(name, NOSPLIT, k.sig())
	Doc(fmt.Sprintf("%s computes up to 8 %s weight rows times one activation row (see asmgen's rowquant.go).", name, nm))
	c0f := k.splatY(0x0f0f0f0f)
	var c10 VecVirtual
	if five {
		c10 = k.splatY(0x10101010)
	}
	// (sc_j, sc_j) word pairs from the 8 scale bytes in both halves.
	var scb []byte
	for h := range 2 {
		for j := range 4 {
			scb = append(scb, byte(4*h+j), 0x80, byte(4*h+j), 0x80)
		}
	}
	scShuf := table("q4kscpairs", scb)
	// d|dmin dwords to d₀..d₃, dmin₀..dmin₃ words.
	dShuf := table("q4kdsplit", []byte{0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15})
	negHi := table("negmhalf", []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
		0, 0, 0, 0x80, 0, 0, 0, 0x80, 0, 0, 0, 0x80, 0, 0, 0, 0x80})
	stash := AllocLocal(4 * 32)
	k.phase1(256, bytes, func(wq, xq, b, slot GPVirtual) {
		mq := GP64()
		MOVQ(b, mq)
		SHLQ(U8(6), mq)
		ADDQ(paramMem("meta"), mq)
		// First the scales and mins of the 4 super-blocks (the scale
		// pairs to the stack, well before the dot products load them).
		var mx [4]VecVirtual
		for t := range 4 {
			blk := func(d int) Mem { return Mem{Base: wq, Disp: bytes*t + d} }
			sc, mn := unpackScalesK4(blk)
			sv := YMM()
			if avx512 {
				VPBROADCASTQ(sc, sv)
			} else {
				x := XMM()
				VMOVQ(sc, x)
				VPBROADCASTQ(x, sv)
			}
			VPSHUFB(scShuf, sv, sv)
			VMOVDQU(sv, stash.Offset(32*t))
			mx[t] = XMM()
			VMOVQ(mn, mx[t])
			VPMOVZXBW(mx[t], mx[t])
			VPMADDWD(Mem{Base: mq, Disp: 64*t + metaSums32}, mx[t], mx[t])
		}
		z := make([]VecVirtual, 4)
		for t := range 4 {
			blk := func(d int) Mem { return Mem{Base: wq, Disp: bytes*t + d} }
			var qh VecVirtual
			if five {
				qh = YMM()
				VMOVDQU(blk(16), qh)
			}
			// Two chains of sums, each started by its first product
			// (no zeroing, no first add).
			const nacc = 2
			acc := make([]VecVirtual, nacc)
			for c := range 4 {
				m := blk(qs + 32*c)
				lo, hi := YMM(), YMM()
				// (VEX has no VPSRLW from memory: one load, two ANDs.)
				VMOVDQU(m, hi)
				VPAND(c0f, hi, lo)
				VPSRLW(U8(4), hi, hi)
				VPAND(c0f, hi, hi)
				for h, v := range []VecVirtual{lo, hi} {
					if five {
						// Bit 2c (2c+1) of each qh byte to bit 4.
						f := YMM()
						switch n := 4 - 2*c - h; {
						case n > 0:
							VPSLLW(U8(n), qh, f)
						case n < 0:
							VPSRLW(U8(-n), qh, f)
						default:
							VMOVDQU(qh, f)
						}
						k.and(c10, f, f)
						if avx512 {
							VPORD(f, v, v)
						} else {
							VPOR(f, v, v)
						}
					}
					p := YMM()
					VPMADDUBSW(Mem{Base: xq, Disp: 256*t + 64*c + 32*h}, v, p)
					if j := 2*c + h; j < nacc {
						s := YMM()
						VPBROADCASTD(stash.Offset(32*t+4*j), s)
						acc[j] = YMM()
						VPMADDWD(s, p, acc[j])
					} else {
						k.pairDot(stash.Offset(32*t+4*j), true, p, acc[j%nacc])
					}
				}
			}
			for i := 1; i < nacc; i++ {
				VPADDD(acc[i], acc[0], acc[0])
			}
			ix := k.extractHi(acc[0])
			VPADDD(acc[0].AsX(), ix, ix)
			z[t] = k.insertHi(ix, mx[t])
		}
		c := k.tree4x2(z)
		f := YMM()
		VCVTDQ2PS(c, f)
		VXORPS(negHi, f, f)
		VMOVUPS(f, Mem{Base: slot})
		q0 := pack2x32(wq, 0, bytes)
		q1 := pack2x32(wq, 2*bytes, bytes)
		x := XMM()
		VMOVQ(q0, x)
		VPINSRQ(U8(1), q1, x, x)
		VPSHUFB(dShuf, x, x)
		ds := YMM()
		VCVTPH2PS(x, ds)
		dy := YMM()
		aux := k.param("aux")
		if avx512 {
			VBROADCASTF32X4(Mem{Base: aux, Index: b, Scale: 4}, dy)
		} else {
			VBROADCASTF128(Mem{Base: aux, Index: b, Scale: 4}, dy)
		}
		VMULPS(dy, ds, ds)
		VMOVUPS(ds, Mem{Base: slot, Disp: 32})
	})
	k.phase2()
	VZEROUPPER()
	RET()
}

// unpackScalesK4 unpacks the 6-bit scales and mins of the Q4_K/Q5_K
// super-block whose bytes blk addresses (ggml's way, in GP registers):
// byte j of sc is scale j, of mn min j.
func unpackScalesK4(blk func(int) Mem) (sc, mn GPVirtual) {
	u0, u1, u2, t1, t2 := GP64(), GP64(), GP64(), GP64(), GP64()
	MOVL(blk(4), u0.As32())
	MOVL(blk(8), u1.As32())
	MOVL(blk(12), u2.As32())
	// Scales 4..7: low 4 bits from bytes 8..11, high 2 from the tops of
	// bytes 0..3; mins 4..7 likewise from the high nibbles and bytes 4..7.
	MOVL(u0.As32(), t1.As32())
	SHRL(U8(6), t1.As32())
	ANDL(U32(0x03030303), t1.As32())
	SHLL(U8(4), t1.As32())
	MOVL(u2.As32(), t2.As32())
	ANDL(U32(0x0f0f0f0f), t2.As32())
	ORL(t1.As32(), t2.As32())
	ANDL(U32(0x3f3f3f3f), u0.As32())
	SHLQ(U8(32), t2)
	ORQ(t2, u0)
	MOVL(u1.As32(), t1.As32())
	SHRL(U8(6), t1.As32())
	ANDL(U32(0x03030303), t1.As32())
	SHLL(U8(4), t1.As32())
	SHRL(U8(4), u2.As32())
	ANDL(U32(0x0f0f0f0f), u2.As32())
	ORL(t1.As32(), u2.As32())
	ANDL(U32(0x3f3f3f3f), u1.As32())
	SHLQ(U8(32), u2)
	ORQ(u2, u1)
	return u0, u1
}
