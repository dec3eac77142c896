package main

// prefetchRows, the kernel that warms the next block of a paged KV cache
// (PREFETCHT0 over its rows' lines) while the current block is computed
// on.

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
)

// prefetchRows emits a loop of PREFETCHT0 over rows rows of lines cache
// lines each, ld bytes apart: warming the next block of a paged KV cache
// while the current one is computed on.
func prefetchRows() {
	TEXT("prefetchRows", NOSPLIT, "func(p uintptr, ld int, rows int, lines int)")
	Doc("prefetchRows prefetches lines cache lines at p + r*ld for r < rows.")
	p := Load(Param("p"), GP64())
	ld := Load(Param("ld"), GP64())
	rows := Load(Param("rows"), GP64())
	lines := Load(Param("lines"), GP64())
	TESTQ(rows, rows)
	JE(LabelRef("done"))
	TESTQ(lines, lines)
	JE(LabelRef("done"))
	Label("row")
	q, l := GP64(), GP64()
	MOVQ(p, q)
	MOVQ(lines, l)
	Label("line")
	PREFETCHT0(Mem{Base: q})
	ADDQ(U32(64), q)
	DECQ(l)
	JNE(LabelRef("line"))
	ADDQ(ld, p)
	DECQ(rows)
	JNE(LabelRef("row"))
	Label("done")
	RET()
}
