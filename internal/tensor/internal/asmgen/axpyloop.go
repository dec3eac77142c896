package main

// The pieces shared by the row-accumulating kernels (axpyRows512,
// axpyRowsGroup, axpyRowsAVX2 and attnValuesAVX2): the block loop over the
// output elements, the loop over the value rows within a block, and the
// addressing of a GQA group's output rows.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// vectorBlocks emits the loop structure of a row-accumulating kernel over
// left elements, lanes to a vector: blocks of wide vectors while they fit
// (label cw), then single vectors (label c<lanes>), then, from label ctail
// while left is not zero, tail, then the return (label done). block emits
// one block (labels prefixed lbl) of vecs vectors and counts the elements
// off left. tail emits the code for the last elements (fewer than lanes):
// one masked block on AVX-512; one element a block on AVX2, jumping back
// to ctail.
func vectorBlocks(left GPVirtual, lanes, wide int, block func(lbl string, vecs int), tail func()) {
	single := fmt.Sprintf("c%d", lanes)
	Label("cw")
	CMPQ(left, U32(lanes*wide))
	JL(LabelRef(single))
	block("w", wide)
	JMP(LabelRef("cw"))
	Label(single)
	CMPQ(left, U32(lanes))
	JL(LabelRef("ctail"))
	block("n", 1)
	JMP(LabelRef(single))
	Label("ctail")
	TESTQ(left, left)
	JE(LabelRef("done"))
	tail()
	Label("done")
	VZEROUPPER()
	RET()
}

// groupRows returns the address of output h's row of g outputs whose rows
// are ld bytes apart from y, plus disp bytes: y, or y2 = y + 2·ld for
// h ≥ 2, plus ld for odd h, so that each takes one base and one index
// register. With g > 2 it allocates y2 and emits its LEAQ, at the point of
// the call.
func groupRows(y, ld Register, g int) func(h, disp int) Mem {
	var y2 GPVirtual
	if g > 2 {
		y2 = GP64()
		LEAQ(Mem{Base: y, Index: ld, Scale: 2}, y2)
	}
	return func(h, disp int) Mem {
		m := Mem{Base: y, Disp: disp}
		if h >= 2 {
			m.Base = y2
		}
		if h%2 == 1 {
			m.Index, m.Scale = ld, 1
		}
		return m
	}
}

// valueRows emits the loop over the rows value rows of a block (labels
// lbl+"row" and lbl+"store"): row r's values at vr = v + r·ldv bytes and
// its weight at ar = a + 4r, handed to body, which emits the row's FMAs.
// No row (rows = 0) jumps straight to lbl+"store", which follows the loop.
func valueRows(lbl string, v, a, rows, ldv Register, body func(vr, ar GPVirtual)) {
	vr, ar, cnt := GP64(), GP64(), GP64()
	MOVQ(v, vr)
	MOVQ(a, ar)
	MOVQ(rows, cnt)
	TESTQ(cnt, cnt)
	JE(LabelRef(lbl + "store"))
	Label(lbl + "row")
	body(vr, ar)
	ADDQ(ldv, vr)
	ADDQ(U8(4), ar)
	DECQ(cnt)
	JNE(LabelRef(lbl + "row"))
	Label(lbl + "store")
}
