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
//
// The scores kernel is here; the softmax step is in attnsoftmax.go, the
// value sum in attnpv.go.

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
