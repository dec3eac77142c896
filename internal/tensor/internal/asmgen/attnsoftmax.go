package main

// The avx512bf16 attention's online-softmax step (attnSoftmaxAVX512, see
// attn.go for the three kernels) and the shortened exponential of its
// weights (expNonPos).

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// expNonPos replaces the lanes of v (≤ 0, or −Inf) with e^v: exp's
// algorithm with the same bits, shortened for the softmax weights. The
// upper clamp is dropped (v ≤ 0), and the scaling by 2^n is one VSCALEFPS:
// p·2^n rounded once, which is what exp's two exact power-of-two factors
// compute (p·2^⌊n/2⌋ is exact, the second product rounds once).
func expNonPos(v VecVirtual) {
	t := ZMM()
	VMOVUPS(cnst(cExpLo), t)
	VMAXPS(v, t, v) // −Inf clamps to −104, whose e^ rounds to +0; NaN stays
	n := ZMM()
	VMULPS(cnst(cLog2e), v, n)
	VRNDSCALEPS(U8(0), n, n)
	VFNMADD231PS(cnst(cLn2Hi), n, v)
	VFNMADD231PS(cnst(cLn2Lo), n, v)
	p := ZMM()
	VMOVUPS(cnst(cP0), p)
	for _, c := range []int{cP1, cP2, cP3, cP4, cP5} {
		VFMADD213PS(cnst(c), v, p)
	}
	r2 := ZMM()
	VMULPS(v, v, r2)
	VFMADD213PS(v, r2, p)
	VADDPS(cnst(cOne), p, p)
	VSCALEFPS(n, p, v)
}

// attnSoftmax emits the online-softmax step. For each of rows rows, with
// s_j (j < n ≤ 64) the row's scores, m and l its running maximum and sum
// and acc its hd unnormalised outputs:
//
//	mc = max_j s_j; if mc > m { f = e^(m−mc); l = l·f; acc[t] = acc[t]·f }; m = max(m, mc)
//	w_j = bf16(e^(s_j − m)) for j < n, 0 for n ≤ j < 64
//	l = l + Σ_j w_j (the widened w_j summed in 4 vectors of 16 lanes,
//	(v0+v1)+(v2+v3), then the fixed tree)
//
// With m = −Inf (the first chunk) f is e^(−104) clamped, but l and acc are
// zero then, so they stay +0: the same as skipping the rescale. Lanes past
// n are loaded as −Inf, whose exponential is exactly +0 (the input clamps
// to −104 and e^−104 rounds to zero), so their weights are 0 with no
// masking. Rows are processed two at a time, their instruction streams
// side by side, so that one row's dependency chains (the maximum, the
// exponentials, the sum) overlap the other's.
func attnSoftmax() {
	TEXT("attnSoftmaxAVX512", NOSPLIT, "func(s *float32, lds int, rows int, n int, m *float32, l *float32, acc *float32, lda int, hd int, w *uint16, ldw int)")
	Doc("attnSoftmaxAVX512 runs one online-softmax step over n ≤ 64 scores for each of rows rows (see asmgen).")
	s := Load(Param("s"), GP64())
	rows := Load(Param("rows"), GP64())
	n := Load(Param("n"), GP64())
	mp := Load(Param("m"), GP64())
	lp := Load(Param("l"), GP64())
	ap := Load(Param("acc"), GP64())
	wp := Load(Param("w"), GP64())
	ones := GP64()
	MOVQ(I32(-1), ones)
	bits := GP64()
	BZHIQ(n, ones, bits)
	km := make([]OpmaskVirtual, 4)
	for i := range km {
		t := GP64()
		MOVQ(bits, t)
		if i > 0 {
			SHRQ(U8(16*i), t)
		}
		km[i] = K()
		KMOVW(t.As32(), km[i])
	}
	ninf := ZMM()
	g := GP32()
	MOVL(U32(0xff800000), g)
	VPBROADCASTD(g, ninf)

	// pass emits the step for k rows (1 or 2) from the current pointers.
	pass := func(p string, k int) {
		lds := Load(Param("lds"), GP64())
		lda := Load(Param("lda"), GP64())
		ldw := Load(Param("ldw"), GP64())
		sr := []Register{s}
		ar := []Register{ap}
		wr := []Register{wp}
		if k == 2 {
			s1, a1, w1 := GP64(), GP64(), GP64()
			LEAQ(Mem{Base: s, Index: lds, Scale: 4}, s1)
			LEAQ(Mem{Base: ap, Index: lda, Scale: 4}, a1)
			LEAQ(Mem{Base: wp, Index: ldw, Scale: 2}, w1)
			sr, ar, wr = append(sr, s1), append(ar, a1), append(wr, w1)
		}
		v := make([][]VecVirtual, k)
		mnew := make([]VecVirtual, k)
		mold := make([]VecVirtual, k)
		mx := make([]VecVirtual, k)
		for r := range k {
			v[r] = make([]VecVirtual, 4)
			for i := range 4 {
				v[r][i] = ZMM()
				VMOVAPS(ninf, v[r][i])
				VMOVUPS(Mem{Base: sr[r], Disp: 64 * i}, km[i], v[r][i])
			}
			mx[r] = ZMM()
			t := ZMM()
			VMAXPS(v[r][1], v[r][0], mx[r])
			VMAXPS(v[r][3], v[r][2], t)
			VMAXPS(t, mx[r], mx[r])
			q := ZMM()
			VSHUFF32X4(U8(0x4E), mx[r], mx[r], q)
			VMAXPS(q, mx[r], mx[r])
			VSHUFF32X4(U8(0xB1), mx[r], mx[r], q)
			VMAXPS(q, mx[r], mx[r])
			VPERMILPS(U8(0x4E), mx[r], q)
			VMAXPS(q, mx[r], mx[r])
			VPERMILPS(U8(0xB1), mx[r], q)
			VMAXPS(q, mx[r], mx[r])
			mold[r] = ZMM()
			VBROADCASTSS(Mem{Base: mp, Disp: 4 * r}, mold[r])
			mnew[r] = ZMM()
			VMAXPS(mold[r], mx[r], mnew[r])
			VMOVSS(mnew[r].AsX(), Mem{Base: mp, Disp: 4 * r})
		}
		for r := range k {
			skip := fmt.Sprintf("%sskip%d", p, r)
			VUCOMISS(mold[r].AsX(), mx[r].AsX()) // flags of mx − mold
			JLS(LabelRef(skip))                  // mx ≤ mold (or NaN): no rescale
			f := ZMM()
			VSUBPS(mnew[r], mold[r], f) // f = mold − mnew
			expNonPos(f)
			lx := XMM()
			VMULSS(Mem{Base: lp, Disp: 4 * r}, f.AsX(), lx)
			VMOVSS(lx, Mem{Base: lp, Disp: 4 * r})
			hd := Load(Param("hd"), GP64())
			hdv := GP64()
			MOVQ(hd, hdv)
			ANDQ(I32(-16), hdv)
			ix := GP64()
			XORQ(ix, ix)
			Label(p + fmt.Sprintf("scale%d", r))
			CMPQ(ix, hdv)
			JGE(LabelRef(p + fmt.Sprintf("scaletail%d", r)))
			a := ZMM()
			VMULPS(Mem{Base: ar[r], Index: ix, Scale: 4}, f, a)
			VMOVUPS(a, Mem{Base: ar[r], Index: ix, Scale: 4})
			ADDQ(U32(16), ix)
			JMP(LabelRef(p + fmt.Sprintf("scale%d", r)))
			Label(p + fmt.Sprintf("scaletail%d", r))
			CMPQ(ix, hd)
			JE(LabelRef(skip))
			kt := tailMask(hd)
			a2 := ZMM()
			VMOVUPS_Z(Mem{Base: ar[r], Index: ix, Scale: 4}, kt, a2)
			VMULPS(f, a2, a2)
			VMOVUPS(a2, kt, Mem{Base: ar[r], Index: ix, Scale: 4})
			Label(skip)
		}
		for r := range k {
			z := make([]VecVirtual, 4)
			for i := range 4 {
				VSUBPS(mnew[r], v[r][i], v[r][i])
				expNonPos(v[r][i])
				h := YMM()
				vcvtneps2bf16(v[r][i], h)
				VMOVDQU(h, Mem{Base: wr[r], Disp: 32 * i})
				z[i] = ZMM()
				VPMOVZXWD(h, z[i])
				VPSLLD(U8(16), z[i], z[i])
			}
			VADDPS(z[1], z[0], z[0])
			VADDPS(z[3], z[2], z[2])
			VADDPS(z[2], z[0], z[0])
			sum := reduce(avx512, z[0])
			VADDSS(Mem{Base: lp, Disp: 4 * r}, sum, sum)
			VMOVSS(sum, Mem{Base: lp, Disp: 4 * r})
		}
		for range k {
			LEAQ(Mem{Base: s, Index: lds, Scale: 4}, s)
			LEAQ(Mem{Base: ap, Index: lda, Scale: 4}, ap)
			LEAQ(Mem{Base: wp, Index: ldw, Scale: 2}, wp)
		}
		ADDQ(U32(4*k), mp)
		ADDQ(U32(4*k), lp)
		SUBQ(U32(k), rows)
	}
	Label("pair")
	CMPQ(rows, U32(2))
	JL(LabelRef("single"))
	pass("p", 2)
	JMP(LabelRef("pair"))
	Label("single")
	TESTQ(rows, rows)
	JE(LabelRef("done"))
	pass("s", 1)
	Label("done")
	VZEROUPPER()
	RET()
}
