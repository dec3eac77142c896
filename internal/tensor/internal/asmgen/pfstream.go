package main

// The KV stream that the avx512bf16 decode attention kernels prefetch
// (attnKeysDP, attnPVStream): a list of runs of consecutive bytes, the
// next bytes the caller's later calls read, walked a cache line at a time
// among the kernels' arithmetic.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
)

// streamLabels numbers streamLine's labels.
var streamLabels int

// streamParams is the stream's part of the kernels' signatures: the
// stream's position, kept in the kernel's own argument words (a kernel
// with every general register in use has one to spare, not three): the
// address of the next line, the end of its run and the address of the
// next run (two words, start and end).
const streamParams = "pf uintptr, pfEnd uintptr, pfNext uintptr"

// streamLine emits one prefetch of the stream (streamParams): it
// prefetches the line, moves the position on by 64 bytes and, at the run's
// end, to the next run. The last run's end is never reached (the caller
// ends the list with one that has no end).
func streamLine() {
	t := GP64()
	MOVQ(paramMem("pf"), t)
	PREFETCHT0(Mem{Base: t})
	ADDQ(U32(64), t)
	MOVQ(t, paramMem("pf"))
	CMPQ(t, paramMem("pfEnd"))
	lbl := fmt.Sprintf("pfs%d", streamLabels)
	streamLabels++
	JB(LabelRef(lbl))
	run := XMM()
	MOVQ(paramMem("pfNext"), t)
	VMOVDQU64(Mem{Base: t}, run)
	ADDQ(U32(16), t)
	MOVQ(t, paramMem("pfNext"))
	VMOVQ(run, t)
	MOVQ(t, paramMem("pf"))
	VPEXTRQ(U8(1), run, t)
	MOVQ(t, paramMem("pfEnd"))
	Label(lbl)
}
