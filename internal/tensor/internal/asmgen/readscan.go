package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// readScanAccs is the number of independent YMM accumulators of
// readScanAVX2: no add waits for another.
const readScanAccs = 8

// readScanStreams are the stream counts readScanAVX2 is emitted for.
var readScanStreams = []int{1, 2, 4, 8}

// readScanAVX2 emits the streaming read that measures a machine's read
// limit (package tensor's ReadScan): the sum, modulo 2⁶⁴, of the 64-bit
// words of streams regions of n bytes each, ld bytes apart (n a multiple
// of 256), read side by side, by VPADDQ from memory into readScanAccs
// accumulators, with, unless pf is 0, a PREFETCHT0 per line pf bytes
// ahead in each region (the row kernels prefetch 8 KiB ahead: the hardware
// prefetchers stop at 4 KiB pages). A step reads max(64, 256/streams)
// bytes of each region. It does one load and one add per 32 bytes and
// nothing else, so it reads as fast as the memory lets one core read: the
// several streams because a core may get more from a few streams side by
// side (as the matrix kernels read 4 rows at once) than from one.
func readScanAVX2(streams int) {
	name := fmt.Sprintf("readScan%dAVX2", streams)
	TEXT(name, NOSPLIT, "func(x *byte, ld int, n int, pf int) uint64")
	Doc(fmt.Sprintf("%s returns the sum of the 64-bit words of x[s·ld:s·ld+n] for s < %d (n a multiple of 256), prefetching pf bytes ahead unless pf is 0.", name, streams))
	x := Load(Param("x"), GP64())
	ld := Load(Param("ld"), GP64())
	n := Load(Param("n"), GP64())
	pf := Load(Param("pf"), GP64())
	ptr := make([]GPVirtual, streams)
	for s := range ptr {
		ptr[s] = GP64()
		if s == 0 {
			MOVQ(x, ptr[s])
		} else {
			LEAQ(Mem{Base: ptr[s-1], Index: ld, Scale: 1}, ptr[s])
		}
	}
	var acc [readScanAccs]VecVirtual
	for i := range acc {
		acc[i] = YMM()
		VPXOR(acc[i], acc[i], acc[i])
	}
	chunk := max(64, 256/streams)
	at := GP64()
	XORQ(at, at)
	TESTQ(n, n)
	JE(LabelRef("rs_done"))
	loop := func(label string, prefetch bool) {
		Label(label)
		a := 0
		for s := range streams {
			if prefetch {
				for l := 0; l < chunk; l += 64 {
					PREFETCHT0(Mem{Base: ptr[s], Index: pf, Scale: 1, Disp: l})
				}
			}
			for o := 0; o < chunk; o += 32 {
				VPADDQ(Mem{Base: ptr[s], Disp: o}, acc[a%readScanAccs], acc[a%readScanAccs])
				a++
			}
			ADDQ(U32(chunk), ptr[s])
		}
		ADDQ(U32(chunk), at)
		CMPQ(at, n)
		JB(LabelRef(label))
		JMP(LabelRef("rs_done"))
	}
	TESTQ(pf, pf)
	JE(LabelRef("rs_plain"))
	loop("rs_pf", true)
	loop("rs_plain", false)
	Label("rs_done")
	for w := readScanAccs / 2; w >= 1; w /= 2 {
		for i := range w {
			VPADDQ(acc[i+w], acc[i], acc[i])
		}
	}
	hi := XMM()
	VEXTRACTI128(U8(1), acc[0], hi)
	VPADDQ(hi, acc[0].AsX(), hi)
	sw := XMM()
	VPUNPCKHQDQ(hi, hi, sw)
	VPADDQ(sw, hi, hi)
	r := GP64()
	VMOVQ(hi, r)
	Store(r, ReturnIndex(0))
	VZEROUPPER()
	RET()
}
