package main

// The attention kernels of the avx512bf16 ISA (see internal/model's
// attention.go for the order of operations they implement).
//
//   - attnScoresDPR1..4: scores of 1..4 bf16 query rows against keys packed
//     16 at a time "pair-transposed" (key group G, pair p: one vector whose
//     lane j is the bf16 pair p of key 16G+j). Each query pair is broadcast
//     and multiplied with VDPBF16PS, so 16 scores come out per vector and no
//     horizontal reduction is needed. Every score is bit-identical to
//     gemmDPBF16 (DotRowsBF16): there lane i of one accumulator takes the
//     pairs i, i+16, i+32, ... in that order (a masked last step counts as
//     one with zero pairs) and the 16 lanes are then reduced by the tree
//     (l+l⁸)(l+l⁴)(l+l²)(l+l¹). Here accumulator P_i takes exactly lane i's
//     dot steps for 16 keys at once, and the P_i are added with the same
//     tree (IEEE addition is commutative, so operand order within one add
//     does not matter).
//   - attnSoftmaxAVX512: one online-softmax step over one key chunk of
//     ≤ 64 scores per row: running maximum, rescale of the running sum and
//     the unnormalised output when it grows, weights e^(s−m) rounded to
//     bf16, running sum of the rounded weights.
//   - attnPVDP: weighted sum of value rows over key pairs with VDPBF16PS,
//     the value rows read in place (by offset: the blocks of a paged pool)
//     and interleaved into pair lanes in registers.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// attnScores emits the scores kernel for rows query rows: for key groups
// G < groups, out[r·ldo + 16G + j] = q_r · key_{16G+j}. Query row r holds
// 32·steps bf16 elements (zero past the head dimension); a key group is
// 16·steps pairs × 16 lanes (1024·steps bytes).
func attnScores(rows int) {
	name := fmt.Sprintf("attnScoresDPR%d", rows)
	TEXT(name, NOSPLIT, "func(q *uint16, ldq int, k *uint32, groups int, steps int, out *float32, ldo int)")
	Doc(fmt.Sprintf("%s computes the scores of %d bf16 query rows against groups of 16 pair-transposed keys (see asmgen).", name, rows))
	qr := make([]GPVirtual, rows)
	qr[0] = Load(Param("q"), GP64()).(GPVirtual)
	if rows > 1 {
		ldq := Load(Param("ldq"), GP64())
		SHLQ(U8(1), ldq)
		for r := 1; r < rows; r++ {
			qr[r] = GP64()
			LEAQ(Mem{Base: qr[r-1], Index: ldq, Scale: 1}, qr[r])
		}
	}
	kp := Load(Param("k"), GP64())
	groups := Load(Param("groups"), GP64())
	steps := Load(Param("steps"), GP64())
	out := Load(Param("out"), GP64())
	// Head dimensions 33..64 and 97..128 (2 and 4 steps) get the dot
	// steps unrolled; others loop over them.
	for _, st := range []int{2, 4} {
		CMPQ(steps, U32(st))
		JE(LabelRef(fmt.Sprintf("u%d", st)))
	}
	scoreGroups(rows, "l", 0, qr, kp, groups, steps, out)
	JMP(LabelRef("done"))
	for _, st := range []int{2, 4} {
		Label(fmt.Sprintf("u%d", st))
		scoreGroups(rows, fmt.Sprintf("u%d", st), st, qr, kp, groups, steps, out)
		JMP(LabelRef("done"))
	}
	Label("done")
	VZEROUPPER()
	RET()
}

// scoreGroups emits the loop over key groups of attnScores (labels
// prefixed p). With unroll > 0 the head dimension takes exactly unroll dot
// steps, emitted straight; with 0 each leaf loops steps times.
func scoreGroups(rows int, p string, unroll int, qr []GPVirtual, kp, groups, steps, out Register) {
	TESTQ(groups, groups)
	JE(LabelRef(p + "end"))
	Label(p + "group")
	// leaf computes P_i for every row: the dot steps s = 0..steps-1 of
	// pair 16s+i, in order.
	leaf := func(i int) []VecVirtual {
		acc := make([]VecVirtual, rows)
		for r := range acc {
			acc[r] = ZMM()
			VXORPS(acc[r], acc[r], acc[r])
		}
		step := func(km, qm func(r int) Mem) {
			kv := ZMM()
			VMOVDQU32(km(0), kv)
			for r := range rows {
				b := ZMM()
				VPBROADCASTD(qm(r), b)
				vdpbf16ps(kv, b, acc[r])
			}
		}
		if unroll > 0 {
			for st := range unroll {
				step(func(int) Mem { return Mem{Base: kp, Disp: 64*i + 1024*st} },
					func(r int) Mem { return Mem{Base: qr[r], Disp: 4*i + 64*st} })
			}
			return acc
		}
		kr, qo, cnt := GP64(), GP64(), GP64()
		LEAQ(Mem{Base: kp, Disp: 64 * i}, kr)
		MOVQ(U32(4*i), qo)
		MOVQ(steps, cnt)
		lbl := fmt.Sprintf("%sleaf%d", p, i)
		Label(lbl)
		step(func(int) Mem { return Mem{Base: kr} },
			func(r int) Mem { return Mem{Base: qr[r], Index: qo, Scale: 1} })
		ADDQ(U32(1024), kr)
		ADDQ(U32(64), qo)
		DECQ(cnt)
		JNE(LabelRef(lbl))
		return acc
	}
	// eval(i, level) is the tree node over leaves i, i+16>>level, ...:
	// level 1 adds P_i and P_{i+8}, level 2 those and the ones 4 up, and
	// so on. Evaluating depth first keeps 5 partial sums per row live.
	var eval func(i, level int) []VecVirtual
	eval = func(i, level int) []VecVirtual {
		if level == 0 {
			return leaf(i)
		}
		a := eval(i, level-1)
		b := eval(i+16>>level, level-1)
		for r := range rows {
			VADDPS(b[r], a[r], a[r])
		}
		return a
	}
	res := eval(0, 4)
	orow := GP64()
	MOVQ(out, orow)
	for r := range rows {
		VMOVUPS(res[r], Mem{Base: orow})
		if r+1 < rows {
			ldo := Load(Param("ldo"), GP64())
			LEAQ(Mem{Base: orow, Index: ldo, Scale: 4}, orow)
		}
	}
	ADDQ(U32(64), out)
	stride := GP64()
	MOVQ(steps, stride)
	SHLQ(U8(10), stride)
	ADDQ(stride, kp)
	DECQ(groups)
	JNE(LabelRef(p + "group"))
	Label(p + "end")
}

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

// pvIndex is the word-permutation table of attnPVDP: its first vector
// interleaves words 0..15 of two tables (word 2i from the first, 2i+1 from
// the second), its second words 16..31.
func pvIndex() Mem {
	t := GLOBL("pvindex", RODATA|NOPTR)
	for half := range 2 {
		for i := range 16 {
			off := half*64 + 4*i
			DATA(off, U16(uint16(16*half+i)))
			DATA(off+2, U16(uint16(32+16*half+i)))
		}
	}
	return t
}

// attnPV emits the weighted value sum over key pairs: for rows r < rows,
// t < hd and pairs (j, j+1), j = 0, 2, 4, ... < n in order, with value row
// j at v + offs[j] (elements; rows anywhere, as the blocks of a paged KV
// pool are),
//
//	acc[r·lda+t] += w[r·ldw+j]·v[offs[j]+t] + w[r·ldw+j+1]·v[offs[j+1]+t]
//
// as one VDPBF16PS lane (weights and values bf16). With n odd the last
// pair's second value is zero and its row is not read (w[r·ldw+n] must be
// zero). Dimensions are walked in blocks of 32, then 16, then a masked
// block; rows in blocks of 8 and one of the rest, with the accumulators in
// registers across all pairs, so each pair of value rows is loaded and
// interleaved (VPERMT2W) once per block of rows.
func attnPV(idx Mem) {
	TEXT("attnPVDP", NOSPLIT, "func(acc *float32, lda int, w *uint16, ldw int, rows int, v *uint16, offs *int, n int, hd int)")
	Doc("attnPVDP adds to rows accumulator rows the n value rows v[offs[j]:] weighted by bf16 weights, over key pairs with VDPBF16PS (see asmgen).")
	idxLo, idxHi := ZMM(), ZMM()
	VMOVDQU16(idx, idxLo)
	VMOVDQU16(idx.Offset(64), idxHi)
	doff := GP64() // element offset of the dimension block
	XORQ(doff, doff)
	// left returns the number of dimensions from doff on.
	left := func() GPVirtual {
		d := Load(Param("hd"), GP64()).(GPVirtual)
		SUBQ(doff, d)
		return d
	}

	block := func(lbl string, dims, rb int, mask Op, ar, wr Register) {
		nv := dims / 16
		var half OpmaskVirtual
		if dims == 16 && mask == nil {
			g := GP32()
			MOVL(U32(0xffff), g)
			half = K()
			KMOVW(g, half)
		}
		lda := Load(Param("lda"), GP64())
		SHLQ(U8(2), lda)
		acc := make([][]VecVirtual, rb)
		arow := GP64()
		MOVQ(ar, arow)
		for r := range rb {
			acc[r] = make([]VecVirtual, nv)
			for c := range nv {
				acc[r][c] = ZMM()
				if mask == nil {
					VMOVUPS(Mem{Base: arow, Disp: 64 * c}, acc[r][c])
				} else {
					VMOVUPS_Z(Mem{Base: arow}, mask, acc[r][c])
				}
			}
			if r+1 < rb {
				ADDQ(lda, arow)
			}
		}
		ldw := Load(Param("ldw"), GP64())
		SHLQ(U8(1), ldw)
		bases := make([]GPVirtual, (rb+2)/3)
		for i := range bases {
			bases[i] = GP64()
			if i == 0 {
				MOVQ(wr, bases[i])
			} else {
				LEAQ(Mem{Base: bases[i-1], Index: ldw, Scale: 2}, bases[i])
				ADDQ(ldw, bases[i])
			}
		}
		wmem := func(r int) Mem {
			m := Mem{Base: bases[r/3]}
			if r%3 != 0 {
				m.Index, m.Scale = ldw, uint8(r%3)
			}
			return m
		}
		vb := Load(Param("v"), GP64())
		LEAQ(Mem{Base: vb, Index: doff, Scale: 2}, vb)
		op := Load(Param("offs"), GP64())
		cnt := Load(Param("n"), GP64())
		SHRQ(U8(1), cnt)
		pair := func(odd bool) {
			a1, b := ZMM(), ZMM()
			load := func(m Mem, dst VecVirtual) {
				// A 16-dimension block loads 16 words into a zmm with a
				// word mask (whole-register writes keep avo's liveness
				// analysis exact; ymm writes would extend the zmm's).
				switch {
				case dims == 32:
					VMOVDQU16(m, dst)
				case mask == nil:
					VMOVDQU16_Z(m, half, dst)
				default:
					VMOVDQU16_Z(m, mask, dst)
				}
			}
			o0 := GP64()
			MOVQ(Mem{Base: op}, o0)
			load(Mem{Base: vb, Index: o0, Scale: 2}, a1)
			if odd {
				VXORPS(b, b, b)
			} else {
				o1 := GP64()
				MOVQ(Mem{Base: op, Disp: 8}, o1)
				load(Mem{Base: vb, Index: o1, Scale: 2}, b)
			}
			var a2 VecVirtual
			if nv == 2 {
				a2 = ZMM()
				VMOVDQA64(a1, a2)
				VPERMT2W(b, idxHi, a2)
			}
			VPERMT2W(b, idxLo, a1)
			for r := range rb {
				bc := ZMM()
				VPBROADCASTD(wmem(r), bc)
				vdpbf16ps(a1, bc, acc[r][0])
				if nv == 2 {
					vdpbf16ps(a2, bc, acc[r][1])
				}
			}
		}
		TESTQ(cnt, cnt)
		JE(LabelRef(lbl + "odd"))
		Label(lbl + "pair")
		pair(false)
		ADDQ(U32(16), op)
		for _, b := range bases {
			ADDQ(U32(4), b)
		}
		DECQ(cnt)
		JNE(LabelRef(lbl + "pair"))
		Label(lbl + "odd")
		nn := Load(Param("n"), GP64())
		TESTQ(U32(1), nn)
		JE(LabelRef(lbl + "store"))
		pair(true)
		Label(lbl + "store")
		lda = Load(Param("lda"), GP64())
		SHLQ(U8(2), lda)
		MOVQ(ar, arow)
		for r := range rb {
			for c := range nv {
				if mask == nil {
					VMOVUPS(acc[r][c], Mem{Base: arow, Disp: 64 * c})
				} else {
					VMOVUPS(acc[r][c], mask, Mem{Base: arow})
				}
			}
			if r+1 < rb {
				ADDQ(lda, arow)
			}
		}
	}

	// rowsLoop runs block over all rows for the current dimension block.
	rowsLoop := func(p string, dims int, mask Op) {
		ar := Load(Param("acc"), GP64())
		LEAQ(Mem{Base: ar, Index: doff, Scale: 4}, ar)
		wr := Load(Param("w"), GP64())
		rl := Load(Param("rows"), GP64())
		advance := func(rb int) {
			lda := Load(Param("lda"), GP64())
			SHLQ(U8(2), lda)
			ldw := Load(Param("ldw"), GP64())
			SHLQ(U8(1), ldw)
			for range rb {
				ADDQ(lda, ar)
				ADDQ(ldw, wr)
			}
			SUBQ(U32(rb), rl)
		}
		Label(p + "r8")
		CMPQ(rl, U32(8))
		JL(LabelRef(p + "rest"))
		block(p+"b8", dims, 8, mask, ar, wr)
		advance(8)
		JMP(LabelRef(p + "r8"))
		// The remaining 0..7 rows in one block (a GQA group of 3 heads
		// is one block).
		Label(p + "rest")
		for rb := 1; rb < 8; rb++ {
			CMPQ(rl, U32(rb))
			JE(LabelRef(fmt.Sprintf("%sb%d", p, rb)))
		}
		JMP(LabelRef(p + "r0"))
		for rb := 1; rb < 8; rb++ {
			Label(fmt.Sprintf("%sb%d", p, rb))
			block(fmt.Sprintf("%sb%d", p, rb), dims, rb, mask, ar, wr)
			JMP(LabelRef(p + "r0"))
		}
		Label(p + "r0")
	}

	Label("d32")
	CMPQ(left(), U32(32))
	JL(LabelRef("d16"))
	rowsLoop("w", 32, nil)
	ADDQ(U32(32), doff)
	JMP(LabelRef("d32"))
	Label("d16")
	CMPQ(left(), U32(16))
	JL(LabelRef("dtail"))
	rowsLoop("h", 16, nil)
	ADDQ(U32(16), doff)
	Label("dtail")
	d := left()
	TESTQ(d, d)
	JE(LabelRef("done"))
	rowsLoop("t", 16, tailMask(d))
	Label("done")
	VZEROUPPER()
	RET()
}
