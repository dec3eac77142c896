package main

// How the AVX2 row kernels read their weight rows as several streams: the
// stream counts and the reason for them, and phase 1 reading k.streams
// rows side by side (phase1Streams) for the two-phase kernels. The 8-stream
// kernels, which read most rows, are in row8.go (32-blocks, Q6_K) and
// row8q4k.go (Q4_K, Q5_K).

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// rowStreamsAVX2 is the number of weight rows the AVX2 row kernels of
// the 32-blocks (Q8_0, Q4_0, Q5_0) read side by side in phase 1, and
// rowStreamsKAVX2 that of the K-quant ones. On the Zen 2 they were tuned
// on (EPYC, family 23 model 49) one core reads one sequential stream at
// only ~15 GB/s, software prefetch or not, but several streams a few
// kilobytes apart at ~20–24 GB/s (tensor.ReadScan at 1, 2, 4 and 8
// streams: the L2's stream prefetchers run ahead in each at once), the
// opposite of the Zen 4 the one-row-at-a-time order was chosen on (see
// rowquant.go), which the AVX-512 kernels keep.
//
// The streams are lds bytes apart, a kernel parameter: package tensor's
// driver splits a thread's rows into that many regions and gives each
// call the next rows of every region, so that each stream runs on
// sequentially from one call to the next (it was the rows r and
// r + rows/2 of one call, 8 rows, whose streams jumped ahead at every
// call). With the regions, four streams took the cold Q8_0 decode kernel
// on one thread from 12.3–12.6 to 14.7–17.2 GB/s (two: 14.5–15.8, eight:
// 12.3–12.6), and two the K-quants' from 10.2–11.8 to 11.9–12.7 (one
// region of rows at a time before; four and eight were slower:
// docs/performance-log.md). Every dtype now reads most rows with row8AVX2,
// row8Q6KAVX2 or row8Q4KAVX2 (8 regions; row8.go, row8q4k.go), whose loops
// have none of phase 2's work; these kernels take the rows left over
// (fewer than 8 per thread's share).
const (
	rowStreamsAVX2  = 4
	rowStreamsKAVX2 = 2
)

// setStreams sets the rows phase 1 reads side by side: n with AVX2, one
// at a time with AVX-512.
func (k *rowKern) setStreams(n int) {
	if !k.avx512 {
		k.streams = n
	}
}

// phase1Streams is phase1 for k.streams > 1: with q = rows / k.streams,
// the call's rows s·q + i (s < k.streams, i < q), at w + s·lds + i·ldw,
// are read side by side, a group of blocks of each stream in turn, for
// i < q; the rows past streams·q (a call of fewer rows than usual) follow
// one at a time after the last stream's. The groups, bodies and scratch
// slots are phase1's, so the results are the same bit for bit.
func (k *rowKern) phase1Streams(elems, bytes int, body func(wq, xq, b, slot GPVirtual)) {
	ways := k.streams
	w := Load(Param("w"), GP64()).(GPVirtual)
	nb := Load(Param("nb"), GP64()).(GPVirtual)
	k.nb = nb
	// Stack: the rows left of the current loop, the distance of two
	// streams in the weights and in the scratch, and the scratch back from
	// the last stream to the first.
	rowsLeft, wStride, sStride, sBack := AllocLocal(8), AllocLocal(8), AllocLocal(8), AllocLocal(8)
	rows := Load(Param("rows"), GP64()).(GPVirtual)
	q := GP64()
	MOVQ(rows, q)
	SHRQ(U8(log2(ways)), q)
	t := GP64()
	MOVQ(paramMem("lds"), t)
	MOVQ(t, wStride)
	// A row's scratch: slotBytes apart in the transposed layout, a
	// slot per group apart otherwise.
	MOVQ(q, t)
	if k.transposed {
		SHLQ(U8(log2(k.slotBytes())), t)
	} else {
		g := GP64()
		MOVQ(nb, g)
		ADDQ(U32(k.group-1), g)
		SHRQ(U8(log2(k.group)), g)
		IMULQ(g, t)
		SHLQ(U8(log2(k.slotBytes())), t)
	}
	MOVQ(t, sStride)
	IMUL3Q(U32(ways-1), t, t)
	MOVQ(t, sBack)
	slot := Load(Param("scratch"), GP64()).(GPVirtual)
	var srow GPVirtual
	if k.transposed {
		srow = GP64()
		MOVQ(slot, srow)
	}
	loop := func(p string, ways int) {
		Label(p + "row")
		if k.transposed {
			MOVQ(srow, slot)
		}
		b8 := GP64()
		XORQ(b8, b8)
		Label(p + "group")
		// b = min(b8, nb − group)
		b := GP64()
		MOVQ(nb, b)
		SUBQ(U32(k.group), b)
		CMPQ(b8, b)
		CMOVQLT(b8, b)
		wq, xq := GP64(), GP64()
		IMUL3Q(U32(bytes), b, wq)
		ADDQ(w, wq)
		MOVQ(b, xq)
		SHLQ(U8(log2(elems)), xq)
		ADDQ(paramMem("x"), xq)
		for s := range ways {
			if s > 0 {
				ADDQ(wStride, wq)
				ADDQ(sStride, slot)
			}
			for off := 0; off < k.group*bytes+63; off += 64 {
				PREFETCHT0(Mem{Base: wq, Disp: rowPfDist + off})
			}
			body(wq, xq, b, slot)
		}
		if ways > 1 {
			SUBQ(sBack, slot)
		}
		if k.transposed {
			ADDQ(U32(qRowMax*k.slotBytes()), slot)
		} else {
			ADDQ(U32(k.slotBytes()), slot)
		}
		ADDQ(U32(k.group), b8)
		CMPQ(b8, nb)
		JB(LabelRef(p + "group"))
		ADDQ(paramMem("ldw"), w)
		if k.transposed {
			ADDQ(U32(k.slotBytes()), srow)
		}
		DECQ(rowsLeft)
		JNE(LabelRef(p + "row"))
	}
	TESTQ(q, q)
	JE(LabelRef("singles"))
	MOVQ(q, rowsLeft)
	loop("s", ways)
	// Past the rows the streams read: w and the scratch move on by the
	// other streams' rows.
	ADDQ(sBack, func() GPVirtual {
		if k.transposed {
			return srow
		}
		return slot
	}())
	MOVQ(wStride, t)
	IMUL3Q(U32(ways-1), t, t)
	ADDQ(t, w)
	Label("singles")
	r := Load(Param("rows"), GP64()).(GPVirtual)
	ANDQ(U32(ways-1), r)
	JE(LabelRef("phase1done"))
	MOVQ(r, rowsLeft)
	loop("", 1)
	Label("phase1done")
	if ways&(ways-1) != 0 || ways > qRowMax {
		panic(fmt.Sprintf("%d row streams: not a power of 2 up to %d", ways, qRowMax))
	}
}
