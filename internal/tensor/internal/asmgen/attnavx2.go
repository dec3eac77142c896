package main

// Attention's scores on AVX2 from keys packed transposed.
//
// attnScoresAVX2R1..3 score 1..3 f32 query rows against keys packed 8 to a
// group: group G holds, for each element t of the head dimension, one
// vector whose lane j is element t of key 8G+j (f32, the pool's bf16
// widened exactly), so group G is hd vectors (32·hd bytes) and one FMA
// yields a partial sum for 8 keys at once, with no horizontal reduction
// per score.
//
// Every score is bit-identical to gemmAVX2BF16R* / gemmAVX2F32R*
// (DotRowsBF16 and DotRows on AVX2): there lane i of a key's accumulator
// takes the FMAs of elements i, i+8, i+16, ... in that order (acc =
// fma(w, x, acc) from +0), the 8 lanes are added by the tree
// ((L0+L4)+(L2+L6)) + ((L1+L5)+(L3+L7)), and the hd%8 tail elements are
// added after that with scalar FMAs in order. Here the accumulator P_i of
// a group takes lane i's FMAs for 8 keys at once (the same operands in
// the same order: FMA and addition are commutative in their operands),
// the P_i are added by the same tree and the tail FMAs follow the same
// way.
//
// The kernels walk keys two groups (16 keys) at a time and compute the
// leaves in pairs (P_i, P_{i+4}): 2 leaves × 2 groups × 3 rows = 12
// accumulators, so each key vector load serves 3 rows and each broadcast
// query element 2 groups, and 12 independent FMA chains cover the FMA
// latency. The partial sums of the tree that wait for their partner go to
// a stack slot (P_0+P_4 and P_1+P_5) or to the output (the left half of the
// tree).

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// attnScoresAVX2 emits the scores kernel for rows (1..3) query rows: for
// key pairs of groups P < pairs and j < 16, out[r·ldo + 16P + j] = q_r ·
// key_{16P+j}, query row r at q + r·ldq (hd f32 elements), the pair's
// groups at k + 2P·8·hd and k + (2P+1)·8·hd (elements).
func attnScoresAVX2(rows int) {
	name := fmt.Sprintf("attnScoresAVX2R%d", rows)
	TEXT(name, NOSPLIT, "func(q *float32, ldq int, k *float32, pairs int, hd int, out *float32, ldo int)")
	Doc(fmt.Sprintf("%s computes the scores of %d f32 query rows against groups of 8 transposed keys, 16 keys per pair (see asmgen).", name, rows))
	spill := AllocLocal(32 * 2 * rows)
	q := Load(Param("q"), GP64())
	ldq := Load(Param("ldq"), GP64())
	SHLQ(U8(2), ldq)
	kp := Load(Param("k"), GP64())
	pairs := Load(Param("pairs"), GP64())
	hd := Load(Param("hd"), GP64())
	gs := GP64() // bytes per group: 8 keys × hd elements × 4
	MOVQ(hd, gs)
	SHLQ(U8(5), gs)
	steps := GP64() // full steps of 8 elements
	MOVQ(hd, steps)
	SHRQ(U8(3), steps)
	out := Load(Param("out"), GP64())
	ldo := Load(Param("ldo"), GP64())
	SHLQ(U8(2), ldo)
	kr, qp, cnt := GP64(), GP64(), GP64()

	// Row r of a matrix whose rows are ld bytes apart: base + r·ld.
	rowMem := func(base, ld Register, r, disp int) Mem {
		m := Mem{Base: base, Disp: disp}
		if r > 0 {
			m.Index, m.Scale = ld, uint8(r)
		}
		return m
	}
	// Group g (0, 1) of the current pair at kr, plus disp bytes.
	keyMem := func(g, disp int) Mem {
		m := Mem{Base: kr, Disp: disp}
		if g == 1 {
			m.Index, m.Scale = gs, 1
		}
		return m
	}

	TESTQ(pairs, pairs)
	JE(LabelRef("done"))
	Label("pair")
	// pass computes A = P_i + P_{i+4} for both groups and every row.
	pass := func(i int) [][]VecVirtual {
		acc := make([][][]VecVirtual, 2) // [leaf][group][row]
		for l := range acc {
			acc[l] = make([][]VecVirtual, 2)
			for g := range acc[l] {
				acc[l][g] = make([]VecVirtual, rows)
				for r := range rows {
					acc[l][g][r] = YMM()
					VXORPS(acc[l][g][r], acc[l][g][r], acc[l][g][r])
				}
			}
		}
		lbl := fmt.Sprintf("leaf%d", i)
		MOVQ(kp, kr)
		ADDQ(U32(32*i), kr)
		LEAQ(Mem{Base: q, Disp: 4 * i}, qp)
		MOVQ(steps, cnt)
		TESTQ(cnt, cnt)
		JE(LabelRef(lbl + "end"))
		Label(lbl)
		for l := range 2 {
			// Leaf i+4l: element 8s+i+4l, 4l vectors (128·l bytes) and
			// 4l query elements (16·l bytes) on from leaf i.
			k := []VecVirtual{YMM(), YMM()}
			for g := range 2 {
				VMOVUPS(keyMem(g, 128*l), k[g])
			}
			for r := range rows {
				b := YMM()
				VBROADCASTSS(rowMem(qp, ldq, r, 16*l), b)
				for g := range 2 {
					VFMADD231PS(k[g], b, acc[l][g][r])
				}
			}
		}
		ADDQ(U32(256), kr)
		ADDQ(U32(32), qp)
		DECQ(cnt)
		JNE(LabelRef(lbl))
		Label(lbl + "end")
		for g := range 2 {
			for r := range rows {
				VADDPS(acc[1][g][r], acc[0][g][r], acc[0][g][r])
			}
		}
		return acc[0]
	}
	slot := func(g, r int) Mem { return spill.Offset(32 * (g*rows + r)) }

	// Left half of the tree: (P0+P4) + (P2+P6), left in the output.
	a := pass(0)
	for g := range 2 {
		for r := range rows {
			VMOVUPS(a[g][r], slot(g, r))
		}
	}
	a = pass(2)
	for g := range 2 {
		for r := range rows {
			VADDPS(slot(g, r), a[g][r], a[g][r])
			VMOVUPS(a[g][r], rowMem(out, ldo, r, 32*g))
		}
	}
	// Right half, (P1+P5) + (P3+P7), then the root.
	a = pass(1)
	for g := range 2 {
		for r := range rows {
			VMOVUPS(a[g][r], slot(g, r))
		}
	}
	a = pass(3)
	for g := range 2 {
		for r := range rows {
			VADDPS(slot(g, r), a[g][r], a[g][r])
			VADDPS(rowMem(out, ldo, r, 32*g), a[g][r], a[g][r])
		}
	}
	// The hd%8 tail elements, in order, one FMA each.
	MOVQ(steps, kr)
	SHLQ(U8(8), kr)
	ADDQ(kp, kr)
	MOVQ(steps, qp)
	SHLQ(U8(5), qp)
	ADDQ(q, qp)
	MOVQ(hd, cnt)
	ANDQ(U32(7), cnt)
	JE(LabelRef("store"))
	Label("tail")
	k := []VecVirtual{YMM(), YMM()}
	for g := range 2 {
		VMOVUPS(keyMem(g, 0), k[g])
	}
	for r := range rows {
		b := YMM()
		VBROADCASTSS(rowMem(qp, ldq, r, 0), b)
		for g := range 2 {
			VFMADD231PS(k[g], b, a[g][r])
		}
	}
	ADDQ(U32(32), kr)
	ADDQ(U32(4), qp)
	DECQ(cnt)
	JNE(LabelRef("tail"))
	Label("store")
	for g := range 2 {
		for r := range rows {
			VMOVUPS(a[g][r], rowMem(out, ldo, r, 32*g))
		}
	}
	LEAQ(Mem{Base: kp, Index: gs, Scale: 2}, kp)
	ADDQ(U32(64), out)
	DECQ(pairs)
	JNE(LabelRef("pair"))
	Label("done")
	VZEROUPPER()
	RET()
}
