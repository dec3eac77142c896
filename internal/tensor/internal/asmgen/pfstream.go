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

// streamLabels numbers streamLines' labels.
var streamLabels int

// streamParams is the stream's part of the kernels' signatures: the
// stream's position, kept in the kernel's own argument words (a kernel
// with every general register in use has one to spare, not three): the
// address of the next line, the end of its run and the address of the
// next run (two words, start and end).
const streamParams = "pf uintptr, pfEnd uintptr, pfNext uintptr"

// streamLines emits k prefetches of the stream (streamParams): it
// prefetches k consecutive lines from the position, moves the position on
// by as many bytes and, at or past its run's end, to the next run (the
// lines past a run's end, fewer than k, are of the bytes after it). The
// last run's end is never reached (the caller ends the list with one that
// has no end). One position update and check for k lines keeps the
// prefetches' own cost near that of a fixed pointer's. The lines go to L2
// (PREFETCHT1): on the AMD Zen 4 it was measured on, SmolLM2's one-thread
// q8_0 token at context 2,048 took ~16% less time than with PREFETCHT0
// (10.9–11.2 ms against 13.0–13.2; PREFETCHT2 the same as T1), the L1's
// miss buffers no longer held by lines wanted 16 KiB later.
func streamLines(k int) {
	t := GP64()
	MOVQ(paramMem("pf"), t)
	for i := range k {
		PREFETCHT1(Mem{Base: t, Disp: 64 * i})
	}
	ADDQ(U32(64*k), t)
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
