package main

// The row kernels of the quantized matrix product with one activation row
// (decode), where the weights stream from DRAM once per token. On the AMD
// Zen 4 (EPYC, family 25 model 17) they were written for, one core reads a
// single sequential stream at 25–32 GB/s but only 8–15 GB/s when it reads
// 4–16 rows of a matrix side by side, a few kilobytes apart, as the panel
// kernels (and the fused single-row kernels they replace) do, and software
// prefetching recovers only part of that. So a row kernel reads its weight
// rows one after the other, each from start to end (the AVX2 kernels, tuned
// on a Zen 2 where one stream is the slower, read rows from two or four
// distant regions of the matrix side by side: see rowstreams.go; a later
// VM of the same Zen 4 model read 8 streams faster than one, 25–29 against
// 17–20 GB/s, and there the AVX2 kernels decode Q8_0, Q4_0 and Q4_K as fast
// or faster: the calibration chooses per format), and works in two phases:
//
//   - phase 1, per weight row and group of blocks (8 blocks of 32, or 4
//     super-blocks): the exact integer dot product of every block with the
//     activation block, from row-major loads (the activations are the same
//     for every row, so nothing is broadcast or transposed), as partial
//     sums in the dword lanes of one vector per block, reduced across lanes
//     by one tree of unpacks and adds for the whole group, so that lane t
//     of the result is block t's integer; the integers converted to f32 and
//     the products of the weight and activation scales are stored to a
//     scratch area;
//   - phase 2, per call of up to 8 rows: each row's f32 chain of the
//     definition (qmatmul.go), one FMA per block (two for Q4_K/Q5_K) in
//     block order. For the 32-blocks (one FMA per 18–34 bytes) the scratch
//     holds the group of 8 rows' vectors side by side and is transposed so
//     that the chains of the 8 rows run in the 8 lanes of one vector; for
//     the K-quants (one or two FMAs per 144–210 bytes) the 8 rows' scalar
//     chains are interleaved.
//
// Because the integers are exact and the chains are the definition's, the
// results are bit-identical to the Go reference and the panel kernels,
// for any number of rows per call or thread.
//
// The Zen 4 executes 512-bit operations as two 256-bit halves, so vector
// width buys nothing but fewer instructions: the 32-block kernels use ymm
// (one 32-byte block per vector), the AVX-512 K-quant kernels zmm (two
// 32-weight sub-blocks per vector, their scales spread by VPERMW), which
// takes fewer instructions per byte where the per-byte work is largest.
// The AVX-512 kernels use EVEX encodings only (the allocator may hand out
// registers 16–31), the AVX2 ones VEX encodings and 16 registers.
//
// On the Zen 5 (family 26: full-width 512-bit units), what bounded the
// AVX-512 Q4_K kernel was not its instruction count (a version with a
// quarter fewer ran no faster; 18% more NOPs cost under 2%) but in part
// the dependence of its dot products on the chain that unpacks the 6-bit
// scales: rowQ4K512 now takes unscaled sub-block sums by VPDPBUSD and
// applies the scales after the reduction (see there). BenchmarkQuantRowKernel
// measures these kernels on L2-resident weights, the best of many trials
// (docs/performance.md has what was tried).
//
// This file holds what every row kernel shares: the signatures, rowKern,
// phase 1 and phase 2, and the list of kernels (rowKernels). The kernels
// are in rowq32.go (Q8_0, Q4_0, Q5_0), rowq32vbmi.go (Q4_0, Q5_0 with
// AVX512-VBMI's byte permutes), rowq4k.go (Q4_K, Q5_K), rowq6k.go
// (Q6_K), rowk512.go (the AVX-512 K-quant variants), row8.go and
// row8q4k.go (the AVX2 8-region kernels; their streams are explained in
// rowstreams.go); their small emitters are in rowemit.go.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// rowSig is the Go signature of the row kernels: rows (1..8) weight rows
// ldw bytes apart from w, nb blocks each (at least one group), times one
// activation row (its levels x, per-block metadata meta and the per-block
// arrays aux of package tensor's qAct.setRowAux), the results in
// out[0:8) (lanes beyond rows are garbage); scratch holds
// qRowMax·ceil(nb/group)·slotBytes bytes.
const rowSig = "func(w *byte, ldw int, rows int, nb int, x *int8, meta *uint32, aux *uint32, scratch *byte, out *float32)"

// rowSigAVX2 is the Go signature of the AVX2 row kernels: rowSig's, and
// lds, the bytes from the first row of one of phase 1's streams to that of
// the next (see phase1Streams).
const rowSigAVX2 = "func(w *byte, ldw int, rows int, nb int, x *int8, meta *uint32, aux *uint32, scratch *byte, out *float32, lds int)"

// sig is the kernel's Go signature.
func (k rowKern) sig() string {
	if k.avx512 {
		return rowSig
	}
	return rowSigAVX2
}

// rowKern holds what the code of one row kernel shares.
type rowKern struct {
	avx512 bool
	// group is the number of blocks per phase-1 step (8 or 4), pairs the
	// number of (f, s) pairs per block in the chain (1, or 2 for
	// Q4_K/Q5_K).
	group, pairs int
	// transposed lays the scratch out group by group (slot g·8 + r for
	// row r), for phase2's vector chains; otherwise row by row.
	transposed bool
	// nb is the kernel's parameter, once phase1 loaded it.
	nb GPVirtual
	// pos, where set, maps pair p of block t of a group to its lane of
	// the group's f (and s) vector in the scratch; otherwise p·group + t.
	pos func(p, t int) int
	// streams is the number of rows phase 1 reads side by side (see
	// rowStreamsAVX2); 0 or 1: one after the other.
	streams int
	// pfL1: phase 1 also prefetches into the L1 (rowPfDistL1; AVX-512).
	pfL1 bool
}

// slotBytes is the scratch size of one group of one row: pairs f32
// vectors of the integers, then pairs of the scale products.
func (k rowKern) slotBytes() int { return 2 * k.pairs * 4 * k.group }

// phase1 emits the loop over the rows and their groups of blocks; body
// emits one group: the weights at wq, the activation bytes at xq, the
// group's first block b and the row's scratch slot at slot (the kernel's
// other parameters load from k.param). The last group of a row whose blocks
// do not divide into groups is the row's last k.group blocks (it overlaps
// the one before; phase 2 skips the repeated blocks). Only the loop
// variables live in registers across groups, for the bodies' GP work.
func (k *rowKern) phase1(elems, bytes int, body func(wq, xq, b, slot GPVirtual)) {
	if k.streams > 1 {
		k.phase1Streams(elems, bytes, body)
		return
	}
	w := Load(Param("w"), GP64()).(GPVirtual)
	nb := Load(Param("nb"), GP64()).(GPVirtual)
	k.nb = nb
	rowsLeft := AllocLocal(8)
	r := Load(Param("rows"), GP64()).(GPVirtual)
	MOVQ(r, rowsLeft)
	slot := Load(Param("scratch"), GP64()).(GPVirtual)
	var srow GPVirtual
	if k.transposed {
		srow = GP64()
		MOVQ(slot, srow)
	}
	Label("row")
	if k.transposed {
		MOVQ(srow, slot)
	}
	b8 := GP64()
	XORQ(b8, b8)
	Label("group")
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
	// Into the L2 on AVX-512 (on a Zen 4, PREFETCHT0 here held the VNNI
	// row kernels' cold decode at 13–16 GB/s, PREFETCHT1 18–22: the lines
	// a group ahead crowded the L1 the group's loads hit), rowPfDistL2
	// ahead, and with pfL1 from there into the L1 rowPfDistL1 ahead.
	for off := 0; off < k.group*bytes+63; off += 64 {
		if k.avx512 {
			PREFETCHT1(Mem{Base: wq, Disp: rowPfDistL2 + off})
			if k.pfL1 {
				PREFETCHT0(Mem{Base: wq, Disp: rowPfDistL1 + off})
			}
		} else {
			PREFETCHT0(Mem{Base: wq, Disp: rowPfDist + off})
		}
	}
	body(wq, xq, b, slot)
	if k.transposed {
		ADDQ(U32(qRowMax*k.slotBytes()), slot)
	} else {
		ADDQ(U32(k.slotBytes()), slot)
	}
	ADDQ(U32(k.group), b8)
	CMPQ(b8, nb)
	JB(LabelRef("group"))
	ADDQ(paramMem("ldw"), w)
	if k.transposed {
		ADDQ(U32(k.slotBytes()), srow)
	}
	DECQ(rowsLeft)
	JNE(LabelRef("row"))
}

// rowPfDist is how far ahead of the group it reads phase 1 prefetches the
// weight row, in bytes: two pages. The hardware prefetchers stop at 4 KiB
// page boundaries, so a kernel reading one stream from DRAM stalls at each
// page start without it; on the Zen 5 this took the cold Q8_0 M=1 kernel
// from 23–28 to 31–36 GB/s on one thread (1 and 2 KiB gained nothing, 4
// KiB half of it, 16 KiB the same; docs/performance.md). Prefetches past
// the end of the weights are harmless (they never fault).
const rowPfDist = 8192

// rowPfDistL2 is rowPfDist for the AVX-512 row kernels, which prefetch into
// the L2: on a Zen 4, 16 KiB decoded Q8_0, Q4_K, Q5_K and Q6_K 2–24% faster
// than 8 KiB on one thread (three rounds), 32 KiB between the two
// (docs/performance-log.md).
const rowPfDistL2 = 16 << 10

// rowPfDistL1 is how far ahead the AVX-512 Q4_K/Q5_K row kernel (pfL1)
// also prefetches into the L1 the lines its L2 prefetches brought in: on a
// Zen 4, one thread, Q4_K decoded 20.5 → 22.2 GB/s from DRAM (five
// rounds; 0.5 and 1 KiB about the same); the other kernels gained nothing
// from DRAM and lost 2–5% on L2-resident weights to the extra
// instructions (docs/performance-log.md).
const rowPfDistL1 = 2 << 10

// param loads the kernel parameter name into a fresh register.
func (k *rowKern) param(name string) GPVirtual {
	return Load(Param(name), GP64()).(GPVirtual)
}

// qRowMax is the most rows of a row kernel call.
const qRowMax = 8

// transpose8 returns the 8×8 dword transpose of v: lane r of t[i] is lane
// i of v[r].
func (k rowKern) transpose8(v []VecVirtual) [8]VecVirtual {
	var a, b [8]VecVirtual
	for i := range 4 {
		a[2*i], a[2*i+1] = YMM(), YMM()
		VPUNPCKLDQ(v[2*i+1], v[2*i], a[2*i])
		VPUNPCKHDQ(v[2*i+1], v[2*i], a[2*i+1])
	}
	// b[4h+i]: rows 4h..4h+3, lane i in the low half, 4+i in the high.
	for h := range 2 {
		a0, a1, a2, a3 := a[4*h], a[4*h+1], a[4*h+2], a[4*h+3]
		for i, pair := range [][2]VecVirtual{{a0, a2}, {a0, a2}, {a1, a3}, {a1, a3}} {
			b[4*h+i] = YMM()
			if i%2 == 0 {
				VPUNPCKLQDQ(pair[1], pair[0], b[4*h+i])
			} else {
				VPUNPCKHQDQ(pair[1], pair[0], b[4*h+i])
			}
		}
	}
	var t [8]VecVirtual
	for i := range 4 {
		t[i], t[4+i] = YMM(), YMM()
		if k.avx512 {
			VSHUFI32X4(U8(0b00), b[4+i], b[i], t[i])
			VSHUFI32X4(U8(0b11), b[4+i], b[i], t[4+i])
		} else {
			VPERM2I128(U8(0x20), b[4+i], b[i], t[i])
			VPERM2I128(U8(0x31), b[4+i], b[i], t[4+i])
		}
	}
	return t
}

// phase2vec emits the chains of the 8 rows in the lanes of one vector
// (scratch laid out transposed, one f vector and one s vector of 8 blocks
// per slot): per group the f vectors of the 8 rows are transposed and
// stored back, the s vectors transposed, and the 8 FMAs run in block
// order; the last group skips the blocks the group before had.
func (k *rowKern) phase2vec() {
	nb := k.nb
	p := Load(Param("scratch"), GP64()).(GPVirtual)
	n := GP64()
	MOVQ(nb, n)
	ADDQ(U32(7), n)
	SHRQ(U8(3), n)
	acc := ymmZero()
	const gs = qRowMax * 64
	group := func(last bool, o GPVirtual) {
		f := make([]VecVirtual, 8)
		for r := range f {
			f[r] = YMM()
			VMOVUPS(Mem{Base: p, Disp: 64 * r}, f[r])
		}
		for i, v := range k.transpose8(f) {
			VMOVUPS(v, Mem{Base: p, Disp: 64 * i})
		}
		for r := range f {
			f[r] = YMM()
			VMOVUPS(Mem{Base: p, Disp: 64*r + 32}, f[r])
		}
		for i, v := range k.transpose8(f) {
			if last {
				CMPQ(o, U8(i))
				JA(LabelRef(fmt.Sprintf("skip%d", i)))
			}
			VFMADD231PS(Mem{Base: p, Disp: 64 * i}, v, acc)
			if last {
				Label(fmt.Sprintf("skip%d", i))
			}
		}
	}
	DECQ(n)
	JE(LabelRef("lastgroup"))
	Label("chain")
	group(false, nil)
	ADDQ(U32(gs), p)
	DECQ(n)
	JNE(LabelRef("chain"))
	Label("lastgroup")
	// o = 8·groups − nb blocks of the last group were in the one before.
	o := GP64()
	MOVQ(nb, o)
	NEGQ(o)
	ANDQ(U8(7), o)
	group(true, o)
	out := Load(Param("out"), GP64()).(GPVirtual)
	VMOVUPS(acc, Mem{Base: out})
}

// phase2 emits the 8 interleaved chains over the scratch rows and stores
// them to out.
func (k *rowKern) phase2() {
	nb := k.nb
	scratch := Load(Param("scratch"), GP64()).(GPVirtual)
	out := Load(Param("out"), GP64()).(GPVirtual)
	groups := GP64()
	MOVQ(nb, groups)
	ADDQ(U32(k.group-1), groups)
	SHRQ(U8(log2(k.group)), groups)
	R := GP64()
	MOVQ(groups, R)
	SHLQ(U8(log2(k.slotBytes())), R)
	R3 := GP64()
	LEAQ(Mem{Base: R, Index: R, Scale: 2}, R3)
	p0, p4 := GP64(), GP64()
	MOVQ(scratch, p0)
	LEAQ(Mem{Base: p0, Index: R, Scale: 4}, p4)
	at := func(r, disp int) Mem {
		m := Mem{Base: p0, Disp: disp}
		if r >= 4 {
			m.Base = p4
		}
		switch r % 4 {
		case 1:
			m.Index, m.Scale = R, 1
		case 2:
			m.Index, m.Scale = R, 2
		case 3:
			m.Index, m.Scale = R3, 1
		}
		return m
	}
	acc := make([]VecVirtual, 8)
	for r := range acc {
		acc[r] = XMM()
		VXORPS(acc[r], acc[r], acc[r])
	}
	step := func(lane int) {
		for p := range k.pairs {
			pos := p*k.group + lane
			if k.pos != nil {
				pos = k.pos(p, lane)
			}
			fo := 4 * pos
			so := 4 * (k.pairs*k.group + pos)
			for r := range 8 {
				f := XMM()
				VMOVSS(at(r, fo), f)
				VFMADD231SS(at(r, so), f, acc[r])
			}
		}
	}
	// Full groups but the last.
	n := GP64()
	MOVQ(groups, n)
	DECQ(n)
	JE(LabelRef("lastgroup"))
	Label("chain")
	for lane := range k.group {
		step(lane)
	}
	ADDQ(U32(k.slotBytes()), p0)
	ADDQ(U32(k.slotBytes()), p4)
	DECQ(n)
	JNE(LabelRef("chain"))
	Label("lastgroup")
	// The last group: lanes from groups·group − nb on (the blocks the
	// group before did not have).
	o := GP64()
	MOVQ(groups, o)
	SHLQ(U8(log2(k.group)), o)
	SUBQ(nb, o)
	for lane := range k.group {
		skip := fmt.Sprintf("tail%d", lane)
		CMPQ(o, U8(lane))
		JA(LabelRef(skip))
		step(lane)
		Label(skip)
	}
	for r := range 8 {
		VMOVSS(acc[r], Mem{Base: out, Disp: 4 * r})
	}
}

// rowKernels emits the row kernels of one instruction set.
func rowKernels(avx512 bool) {
	for _, q := range []quant32{{"Q8_0", 34}, {"Q4_0", 18}, {"Q5_0", 22}} {
		row32(avx512, q)
	}
	if avx512 {
		rowQ4K512(false)
		rowQ4K512(true)
		rowQ6K512()
		row32VBMI(false)
		row32VBMI(true)
		return
	}
	rowQ4K(false, false)
	rowQ4K(false, true)
	rowQ6K(false)
	for _, q := range []quant32{{"Q8_0", 34}, {"Q4_0", 18}, {"Q5_0", 22}} {
		row8AVX2(q)
	}
	row8Q6KAVX2()
	row8Q4KAVX2(false)
	row8Q4KAVX2(true)
}
