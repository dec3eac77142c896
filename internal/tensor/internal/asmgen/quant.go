package main

// The quantized matrix kernels (AVX512-VNNI). Package tensor defines every
// output as exact integer block dot products followed by one fixed chain of
// f32 fused multiply-adds over the blocks (see its qmatmul.go); the
// kernels are free in how they compute the integers, and use that freedom
// to put 16 weight rows in the 16 lanes of a vector:
//
//   - a pack kernel (phase A) reads 16 weight rows in ggml's block layout
//     and writes a panel: per block, the levels transposed so that one
//     vector holds 4 consecutive levels of each of the 16 rows (as
//     unsigned bytes), and the rows' scales as 16 f32 (and, for the
//     K-quants, the sub-block scales and mins as vectors of 16);
//   - a dot kernel (phase B) multiplies a few activation rows with the
//     panel: VPDPBUSD of a panel vector (unsigned) with 4 activation bytes
//     broadcast to every lane (signed) accumulates the block's integer dot
//     product of all 16 rows at once, exactly; a correction the activation
//     quantizer precomputed accounts for the unsigned offset of the
//     levels; then per block one VCVTDQ2PS and one VFMADD231PS with the
//     product of the two scales continue each lane's f32 chain.
//
// The integer sums never overflow int32, and every chain runs over the
// blocks in order, one FMA per block (two for Q4_K/Q5_K), so the result is
// the definition's whatever the number of activation rows per call. The
// activations are quantized by qact8_0/qact8K (qact.go), bit-identical to the Go
// quantizers. A single activation row (decode) goes to the row kernels of
// rowquant.go instead, which read the weights row after row, unless the
// model stores the matrix as panels at load (package tensor's PackPanels):
// Q8_0 as the pack kernel writes them, the others in layouts that keep
// ggml's bytes (quant32.go's p40n and p50n, quantkdot.go's pn, quantk5n.go's
// p5, quantk6n.go's p6n) with their own pack and dot kernels; one
// activation row then runs the dot kernel.
//
// Measured on the Emerald Rapids this was first tuned on: VPDPBUSD zmm
// issues once per cycle, VPMULLD costs two uops, 512-bit shuffles go to
// one port and VPGATHERDD is slow; two accumulators per chain help the
// dependent VPDPBUSDs.
//
// This file holds the list of kernels (quantKernels), the VNNI emitters and
// what the AVX-512 and AVX2 kernels share (signatures, prefetch). The row
// addressing, transposes and gathers are in quantrows.go, the kernels in
// quant32.go (Q8_0, Q4_0, Q5_0), quantk.go (the K-quants' packs) and
// quantkdot.go (their dot kernel); the AVX2 ones in quant_avx2.go.

import (
	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// vnni emits an AVX512-VNNI instruction (which avo does not know, but Go's
// assembler does) as acc op= (a, b), Go operand order b, a, acc; b is a
// register or, with bcast, a 4-byte memory operand broadcast to every lane.
func vnni(opcode string, b Op, a, acc VecVirtual, bcast bool) {
	ins := &ir.Instruction{
		Opcode:   opcode,
		Operands: []Op{b, a, acc},
		Inputs:   []Op{b, a, acc},
		Outputs:  []Op{acc},
	}
	if bcast {
		ins.Suffixes = []string{"BCST"}
	}
	Instruction(ins)
}

// vpdpbusd emits acc += Σ₄ unsigned(a)·signed(b) per dword lane.
func vpdpbusd(b Op, a, acc VecVirtual, bcast bool) { vnni("VPDPBUSD", b, a, acc, bcast) }

// vpdpwssd emits acc += Σ₂ signed(a)·signed(b) over int16 pairs per dword
// lane.
func vpdpwssd(b Op, a, acc VecVirtual, bcast bool) { vnni("VPDPWSSD", b, a, acc, bcast) }

// splat returns a ZMM holding the dword v in every lane.
func splat(v uint32) VecVirtual {
	g := GP32()
	MOVL(U32(v), g)
	z := ZMM()
	VPBROADCASTD(g, z)
	return z
}

// quant32 describes a dtype with 32-weight blocks for the pack kernel.
type quant32 struct {
	name  string
	bytes int // block size
}

// packSig is the Go signature of the pack kernels.
const packSig = "func(w *byte, ldw int, nb int, dst *byte, pf uintptr)"

// prefetchNext emits the pack kernels' prefetch for one block step: the
// cache lines of [pf, pf+step) and pf advanced by step. The driver points pf
// at the part of the next group of weight rows (contiguous in memory) that
// corresponds to this call's blocks, so that the matrix is fetched from
// DRAM as one sequential stream a group ahead: reading 8–16 rows side by
// side, as the transposes do, gets a fraction of one stream's bandwidth.
// The AVX-512 kernels (toL2) prefetch into the L2 only, as the other
// AVX-512 multi-row kernels do (see dpbf16.go's dpPass); the AVX2 ones,
// tuned on a Zen 2, into the L1 as before.
func prefetchNext(pf GPVirtual, step int, toL2 bool) {
	for off := 0; off < step+63; off += 64 {
		if toL2 {
			PREFETCHT1(Mem{Base: pf, Disp: off})
		} else {
			PREFETCHT0(Mem{Base: pf, Disp: off})
		}
	}
	ADDQ(U32(step), pf)
}

// dotSig is the Go signature of the dot kernels.
const dotSig = "func(x *int8, ldx int, meta *uint32, ldm int, panel *byte, nb int, acc *float32)"

// dotArgs loads the arguments of a dot kernel (dotSig) for rows activation
// rows: the rows of x and of their metadata, the panel, the block count and
// the accumulators' address.
func dotArgs(rows int) (x, m rowSet, panel, nb, accp Register) {
	x = newRowSet(Load(Param("x"), GP64()).(GPVirtual), Load(Param("ldx"), GP64()).(GPVirtual), rows)
	m = newRowSet(Load(Param("meta"), GP64()).(GPVirtual), Load(Param("ldm"), GP64()).(GPVirtual), rows)
	panel = Load(Param("panel"), GP64())
	nb = Load(Param("nb"), GP64())
	accp = Load(Param("acc"), GP64())
	return x, m, panel, nb, accp
}

// packArgs loads a pack kernel's arguments (packSig): the first of 16
// weight rows and their stride, the blocks, the panel and the address to
// prefetch from.
func packArgs() (w, ldw GPVirtual, nb Register, dst, pf GPVirtual) {
	w = Load(Param("w"), GP64()).(GPVirtual)
	ldw = Load(Param("ldw"), GP64()).(GPVirtual)
	nb = Load(Param("nb"), GP64())
	dst = Load(Param("dst"), GP64()).(GPVirtual)
	pf = Load(Param("pf"), GP64()).(GPVirtual)
	return w, ldw, nb, dst, pf
}

// widenKernel emits a kernel that widens nb blocks of a panel as a model
// stores it (srcBytes each, at src) into the pack kernel's layout
// (dstBytes each, at dst), prefetching as many bytes from pf: setup emits
// what every block needs (constants) and returns body, which emits one
// block.
func widenKernel(name, doc string, srcBytes, dstBytes int, setup func() func(src, dst Register)) {
	TEXT(name, NOSPLIT, "func(src *byte, nb int, dst *byte, pf uintptr)")
	Doc(doc)
	src := Load(Param("src"), GP64())
	nb := Load(Param("nb"), GP64())
	dst := Load(Param("dst"), GP64())
	pf := Load(Param("pf"), GP64()).(GPVirtual)
	body := setup()
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	prefetchNext(pf, srcBytes, true)
	body(src, dst)
	ADDQ(U32(srcBytes), src)
	ADDQ(U32(dstBytes), dst)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// loadAccs loads the rows 16-lane f32 chains a dot kernel continues from
// accp.
func loadAccs(accp Register, rows int) []VecVirtual {
	acc := make([]VecVirtual, rows)
	for r := range acc {
		acc[r] = ZMM()
		VMOVUPS(Mem{Base: accp, Disp: 64 * r}, acc[r])
	}
	return acc
}

// blockFMA continues each row's chain with one block's integers is: acc =
// fma(float(is), dw·dx, acc), dx the f32 at disp in the row's metadata.
func blockFMA(m rowSet, disp int, dw VecVirtual, is, acc []VecVirtual) {
	for r := range acc {
		s := ZMM()
		VMULPS_BCST(m.at(r, disp), dw, s)
		f := ZMM()
		VCVTDQ2PS(is[r], f)
		VFMADD231PS(s, f, acc[r])
	}
}

// storeAccs emits a dot kernel's end from label store on: the chains
// stored back to accp, then the return.
func storeAccs(accp Register, acc []VecVirtual) {
	Label("store")
	for r := range acc {
		VMOVUPS(acc[r], Mem{Base: accp, Disp: 64 * r})
	}
	VZEROUPPER()
	RET()
}

// quantKernels emits the quantized matrix kernels.
func quantKernels() {
	pack32(quant32{"Q8_0", 34})
	pack32(quant32{"Q4_0", 18})
	pack32(quant32{"Q5_0", 22})
	for r := 1; r <= maxDot32Rows; r++ {
		dot32(r)
	}
	pack40N(false)
	pack40N(true)
	widen40N()
	widen50N()
	for r := 1; r <= maxDot40NRows; r++ {
		dot40N(r, false)
		dot40N(r, true)
	}
	packQ4K(false, false)
	packQ4K(true, false)
	packQ4K(false, true)
	packQ4K(true, true)
	widenQ4KN()
	widenQ5KN()
	packQ6K()
	pack6N()
	widen6N()
	for r := 1; r <= maxDot6NRows; r++ {
		dot6N(r)
	}
	for r := 1; r <= maxDotKRows; r++ {
		dotK(r, panelQ4K)
		dotK(r, panelQ6K)
		dotK(r, panelQ4KN)
		if r <= maxDotK5Rows {
			dotK5N(r)
		}
	}
	qact8_0()
	qact8K()
}
