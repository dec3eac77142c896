package main

// The AMX kernels. Neither Go's assembler nor avo knows AMX, so, as with
// VDPBF16PS (evexraw.go), the generator emits pseudo-instructions whose
// general-register operands avo allocates, and encodeAMX replaces each by
// its VEX encoding (rawEncode). Tiles are named by number ($0..$7).
//
// qamx32R16 multiplies 16 activation rows by a 16-row panel of 32-weight
// blocks in the pack kernel's layout (panel32: 8 vectors of unsigned
// levels, vector i holding levels 4i..4i+3 of row r at bytes 4r..4r+3 —
// which is AMX's layout of a K×N tile B, 4 consecutive k of a column side
// by side — then the 16 scales as f32). Per block, TDPBSUD sums the signed
// activation bytes (tile A: 16 rows × 32 bytes) times the unsigned levels
// (tile B: 8 rows × 64 bytes) exactly into a 16×16 int32 tile, stored to
// scratch; then each row r continues its 16 chains as the VNNI dot kernels
// do (dot32): I = corr + Σ, acc = fma(float(I), scales·dx, acc). The
// integers are exact and the chain's operations are the definition's, so
// the results are the bits of every other quantized kernel. qamxKR16 and
// qamx6KR16 do the same for the K-quants' widened panels, a sub-block a
// TDPBSUD. gemmAMXBF16 and gemmAMXBF16x4 are the amxbf16 kernel set's bf16
// products (TDPBF16PS), the weights read as stored. Each is tested on an
// emulated Sapphire Rapids (package tensor's Test…UnderBochs), its code
// found through its …Entry function.

import (
	"fmt"
	"math/bits"
	"regexp"
	"strconv"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The tiles of the int8 AMX kernels, as their configuration (palette 1,
// loaded from their cfg argument: package tensor's amxConfig32 and
// amxConfig16) shapes them: C the 16×16 int32 sums (16 rows of 64 bytes),
// A 16 activation rows of a block's bytes, B the block's levels (rows of
// 64 bytes); two sets, so that one block's TDPBSUD need not wait for the
// previous block's tiles to be stored.
var amxSets = [2][3]int{{0, 1, 2}, {3, 4, 5}}

// amxBlock emits one block's product with tile set t: C zeroed, A from
// x (stride ldx), B from panel (stride line), C += A·B, C stored to
// scratch (stride line).
func amxBlock(t int, x, ldx, panel, line, scratch Register) {
	c, a, b := amxSets[t][0], amxSets[t][1], amxSets[t][2]
	tilezero(c)
	tileloadd(a, x, ldx)
	tileloadd(b, panel, line)
	tdpbsud(c, a, b)
	tilestored(c, scratch, line)
}

func amxInstruction(opcode string, operands ...Op) {
	var in []Op
	for _, op := range operands {
		if _, ok := op.(Register); ok {
			in = append(in, op)
		}
	}
	Instruction(&ir.Instruction{Opcode: opcode, Operands: operands, Inputs: in})
}

// ldtilecfg loads the tile configuration (64 bytes) at the address in cfg.
func ldtilecfg(cfg Register) { amxInstruction("LDTILECFG", cfg) }

// tilerelease returns the tiles to their initial state.
func tilerelease() { amxInstruction("TILERELEASE") }

// tilezero zeroes tile t.
func tilezero(t int) { amxInstruction("TILEZERO", U8(t)) }

// tileloadd loads tile t's rows from base, stride bytes apart.
func tileloadd(t int, base, stride Register) { amxInstruction("TILELOADD", base, stride, U8(t)) }

// tilestored stores tile t's rows to base, stride bytes apart.
func tilestored(t int, base, stride Register) { amxInstruction("TILESTORED", base, stride, U8(t)) }

// tdpbsud emits C += A·B over signed bytes of A and unsigned bytes of B.
func tdpbsud(c, a, b int) { amxInstruction("TDPBSUD", U8(c), U8(a), U8(b)) }

// tdpbf16ps emits C += A·B over bf16 pairs, accumulating in f32.
func tdpbf16ps(c, a, b int) { amxInstruction("TDPBF16PS", U8(c), U8(a), U8(b)) }

// int8AMXSig is the int8 AMX dot kernels' signature (package tensor's
// amxKernel).
const int8AMXSig = "func(x *int8, ldx int, meta *uint32, panel *byte, nb int, acc *float32, cfg *byte, scratch *int32)"

// loadInt8AMX loads the int8 AMX dot kernels' arguments, configures the
// tiles from cfg, and returns the registers with line holding 64.
func loadInt8AMX() (x, ldx, meta, panel, nb, accp, scratch, line Register) {
	x = Load(Param("x"), GP64())
	ldx = Load(Param("ldx"), GP64())
	meta = Load(Param("meta"), GP64())
	panel = Load(Param("panel"), GP64())
	nb = Load(Param("nb"), GP64())
	accp = Load(Param("acc"), GP64())
	ldtilecfg(Load(Param("cfg"), GP64()))
	scratch = Load(Param("scratch"), GP64())
	line = GP64()
	MOVQ(U32(64), line)
	return
}

// qamx32R16 emits the kernel (see the top of the file). Its meta is the
// activation rows' per-block records arranged for it (package tensor's
// amxMeta): per block the 16 rows' scales dx (f32), then their
// corrections (int32).
func qamx32R16() {
	const rows = 16
	TEXT("qamx32R16", NOSPLIT, int8AMXSig)
	Doc("qamx32R16 continues the 16-lane f32 chains of 16 activation rows over nb blocks of a Q8_0/Q4_0/Q5_0 panel with AMX (see asmgen).")
	x, ldx, meta, panel, nb, accp, scratch, line := loadInt8AMX()
	acc := loadAccs(accp, rows)
	// The chains of the block whose sums are at sums, its panel at p and
	// its records at m.
	chains := func(sums, p, m Register, pdisp, mdisp int) {
		dw := ZMM()
		VMOVUPS(Mem{Base: p, Disp: pdisp + 512}, dw)
		for r := range rows {
			is := ZMM()
			VMOVDQU32(Mem{Base: sums, Disp: 64 * r}, is)
			VPADDD_BCST(Mem{Base: m, Disp: mdisp + 64 + 4*r}, is, is)
			s := ZMM()
			VMULPS_BCST(Mem{Base: m, Disp: mdisp + 4*r}, dw, s)
			f := ZMM()
			VCVTDQ2PS(is, f)
			VFMADD231PS(s, f, acc[r])
		}
	}
	// Two blocks a trip, one per tile set, both products issued before
	// either's chains; then a block alone if nb is odd.
	x1, p1, s1 := GP64(), GP64(), GP64()
	MOVQ(scratch, s1)
	ADDQ(U32(1024), s1)
	CMPQ(nb, U8(2))
	JL(LabelRef("last"))
	Label("pair")
	amxBlock(0, x, ldx, panel, line, scratch)
	MOVQ(x, x1)
	ADDQ(U32(32), x1)
	MOVQ(panel, p1)
	ADDQ(U32(panel32Bytes), p1)
	amxBlock(1, x1, ldx, p1, line, s1)
	chains(scratch, panel, meta, 0, 0)
	chains(s1, panel, meta, panel32Bytes, 128)
	ADDQ(U32(64), x)
	ADDQ(U32(256), meta)
	ADDQ(U32(2*panel32Bytes), panel)
	SUBQ(U8(2), nb)
	CMPQ(nb, U8(2))
	JGE(LabelRef("pair"))
	Label("last")
	TESTQ(nb, nb)
	JE(LabelRef("store"))
	amxBlock(0, x, ldx, panel, line, scratch)
	chains(scratch, panel, meta, 0, 0)
	Label("store")
	for r := range acc {
		VMOVUPS(acc[r], Mem{Base: accp, Disp: 64 * r})
	}
	tilerelease()
	VZEROUPPER()
	RET()
}

// bf16AMXArgs are the arguments the bf16 AMX kernels share, loaded and
// scaled: ldw and ldo in bytes, k in steps of 32; the tiles configured
// from cfg, the gather offsets (idx) in zidx, and line 64.
type bf16AMXArgs struct {
	w, ldw, xp, k, rows, out, ldo, scratch, line Register
	zidx                                         VecVirtual
}

// loadBF16AMX loads bf16AMXArgs and configures the tiles.
func loadBF16AMX() bf16AMXArgs {
	var a bf16AMXArgs
	a.w = Load(Param("w"), GP64())
	a.ldw = Load(Param("ldw"), GP64())
	SHLQ(U8(1), a.ldw)
	a.xp = Load(Param("xp"), GP64())
	a.k = Load(Param("k"), GP64())
	SHRQ(U8(5), a.k)
	a.rows = Load(Param("rows"), GP64())
	a.out = Load(Param("out"), GP64())
	a.ldo = Load(Param("ldo"), GP64())
	SHLQ(U8(2), a.ldo)
	ldtilecfg(Load(Param("cfg"), GP64()))
	a.scratch = Load(Param("scratch"), GP64())
	a.zidx = ZMM()
	VMOVDQU32(Mem{Base: Load(Param("idx"), GP64())}, a.zidx)
	a.line = GP64()
	MOVQ(U32(64), a.line)
	return a
}

// nextWeightRows ends a bf16 AMX kernel's pass over n (16 or 32) weight
// rows: the weights and the outputs advanced past them, back to label
// group while rows are left, else the return.
func nextWeightRows(a bf16AMXArgs, n int) {
	t := GP64()
	MOVQ(a.ldw, t)
	SHLQ(U8(bits.TrailingZeros(uint(n))), t)
	ADDQ(t, a.w)
	ADDQ(U32(4*n), a.out)
	SUBQ(U32(n), a.rows)
	JNE(LabelRef("group"))
	tilerelease()
	VZEROUPPER()
	RET()
}

// storeColumns writes n columns (an immediate or a register) of the tile
// of sums stored at sums (16 rows of 64 bytes) to out, ldo bytes apart: a
// column (16 weight rows' outputs for one activation row) by a gather with
// the offsets in zidx. label names the loop.
func storeColumns(label string, sums, out, ldo Register, zidx VecVirtual, n Op) {
	sj, oj, j := GP64(), GP64(), GP64()
	MOVQ(sums, sj)
	MOVQ(out, oj)
	MOVQ(n, j)
	Label(label)
	v := ZMM()
	KXNORW(K1, K1, K1)
	VGATHERDPS(Mem{Base: sj, Index: zidx, Scale: 4}, K1, v)
	VMOVUPS(v, Mem{Base: oj})
	ADDQ(U32(4), sj)
	ADDQ(ldo, oj)
	DECQ(j)
	JNE(LabelRef(label))
}

// gemmAMXBF16 emits the bf16 kernel of the amxbf16 kernel set: rows
// (a multiple of 16) weight rows of k (a multiple of 32) bf16 by r ≤ 16
// bf16 activation rows, out[j·ldo + i] for j < r. The weights are tile A
// as they are stored (16 rows of 32 weights, ldw apart): no repacking;
// the activations, packed by the caller as tile B wants them (per pair of
// k, the pairs of the 16 activation rows side by side: 64 bytes, 1 KiB a
// step of 32 k), are tile B, its columns r (the configuration at cfg, one
// per r: package tensor's amxBF16Config). Each 16 weight rows accumulate
// over the whole of k in tile C (TDPBF16PS in k order), which is stored
// and written out column by column (a gather with the offsets at idx,
// 16·i) transposed: every output takes the same instructions whatever r
// is, so the set is batch invariant by construction.
func gemmAMXBF16() {
	const tC, tA, tB = 0, 1, 2
	TEXT("gemmAMXBF16", NOSPLIT, "func(w *uint16, ldw int, xp *uint16, k int, rows int, r int, out *float32, ldo int, cfg *byte, scratch *float32, idx *int32)")
	Doc("gemmAMXBF16 multiplies rows bf16 weight rows by r packed bf16 activation rows with AMX (see asmgen).")
	a := loadBF16AMX()
	w, ldw, xp, k, out, ldo, scratch, line := a.w, a.ldw, a.xp, a.k, a.out, a.ldo, a.scratch, a.line
	r := Load(Param("r"), GP64())
	Label("group")
	tilezero(tC)
	wp, bp, cnt := GP64(), GP64(), GP64()
	MOVQ(w, wp)
	MOVQ(xp, bp)
	MOVQ(k, cnt)
	Label("kstep")
	tileloadd(tA, wp, ldw)
	tileloadd(tB, bp, line)
	tdpbf16ps(tC, tA, tB)
	ADDQ(U32(64), wp)
	ADDQ(U32(1024), bp)
	DECQ(cnt)
	JNE(LabelRef("kstep"))
	tilestored(tC, scratch, line)
	// Column j of C (weight rows i, activation row j) to out + j·ldo.
	storeColumns("column", scratch, out, ldo, a.zidx, r)
	nextWeightRows(a, 16)
}

// peakAMX emits the AMX peak kernel name (peak.go's kind of loop): iters
// passes of op over 4 independent accumulator tiles (0–3), with tiles 4
// and 5 loaded from ones (16 rows of 64 bytes of 1s), full 16×64 tiles
// (the configuration at cfg, package tensor's amxFullConfig); then the
// tiles stored to scratch (4 KiB) and their 64 rows summed into the 16
// lanes stored at out (each lane iters·64·(products a lane of a row)).
func peakAMX(name, what string, ints bool, op func(c, a, b int)) {
	elem := "float32"
	if ints {
		elem = "int32"
	}
	TEXT(name, NOSPLIT, fmt.Sprintf("func(iters int, out *%s, cfg *byte, ones *byte, scratch *byte)", elem))
	Doc(fmt.Sprintf("%s runs iters passes of %s over 4 independent tiles of ones and stores the sums of their rows at out (see asmgen).", name, what))
	n := Load(Param("iters"), GP64())
	out := Load(Param("out"), GP64())
	cfg := Load(Param("cfg"), GP64())
	ones := Load(Param("ones"), GP64())
	scratch := Load(Param("scratch"), GP64())
	ldtilecfg(cfg)
	line := GP64()
	MOVQ(U32(64), line)
	for t := range 4 {
		tilezero(t)
	}
	tileloadd(4, ones, line)
	tileloadd(5, ones, line)
	TESTQ(n, n)
	JLE(LabelRef(name + "_done"))
	Label(name + "_loop")
	for t := range 4 {
		op(t, 4, 5)
	}
	DECQ(n)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	p := GP64()
	MOVQ(scratch, p)
	for t := range 4 {
		tilestored(t, p, line)
		ADDQ(U32(1024), p)
	}
	sum := ZMM()
	VXORPS(sum, sum, sum)
	for row := range 64 {
		if ints {
			VPADDD(Mem{Base: scratch, Disp: 64 * row}, sum, sum)
		} else {
			VADDPS(Mem{Base: scratch, Disp: 64 * row}, sum, sum)
		}
	}
	VMOVUPS(sum, Mem{Base: out})
	tilerelease()
	VZEROUPPER()
	RET()
}

// gemmAMXBF16x4 emits gemmAMXBF16 for prefill: 32 weight rows by two full
// groups of 16 activation rows at a time, four tiles of sums (weight
// group i by activation group j) from two tiles of weights and two of
// activations, so each tile loaded serves two TDPBF16PS (Intel's 2×2
// blocking); rows is a multiple of 32, the groups' packs xstride bytes
// apart, the configuration package tensor's amxFullConfig (every tile 16
// rows of 64 bytes). Each output takes the instructions gemmAMXBF16 gives
// it, in the same order: the same bits.
func gemmAMXBF16x4() {
	TEXT("gemmAMXBF16x4", NOSPLIT, "func(w *uint16, ldw int, xp *uint16, xstride int, k int, rows int, out *float32, ldo int, cfg *byte, scratch *float32, idx *int32)")
	Doc("gemmAMXBF16x4 multiplies rows (a multiple of 32) bf16 weight rows by two full groups of 16 packed bf16 activation rows with AMX, 2×2 tiles of sums (see asmgen).")
	a := loadBF16AMX()
	w, ldw, xp, k, out, ldo, scratch, line := a.w, a.ldw, a.xp, a.k, a.out, a.ldo, a.scratch, a.line
	xstride := Load(Param("xstride"), GP64())
	Label("group")
	for t := range 4 {
		tilezero(t)
	}
	w0, w1, b0, b1, cnt := GP64(), GP64(), GP64(), GP64(), GP64()
	MOVQ(w, w0)
	MOVQ(ldw, w1)
	SHLQ(U8(4), w1)
	ADDQ(w, w1)
	MOVQ(xp, b0)
	MOVQ(xp, b1)
	ADDQ(xstride, b1)
	MOVQ(k, cnt)
	Label("kstep")
	tileloadd(4, w0, ldw)
	tileloadd(5, w1, ldw)
	tileloadd(6, b0, line)
	tileloadd(7, b1, line)
	tdpbf16ps(0, 4, 6)
	tdpbf16ps(1, 4, 7)
	tdpbf16ps(2, 5, 6)
	tdpbf16ps(3, 5, 7)
	ADDQ(U32(64), w0)
	ADDQ(U32(64), w1)
	ADDQ(U32(1024), b0)
	ADDQ(U32(1024), b1)
	DECQ(cnt)
	JNE(LabelRef("kstep"))
	sp := GP64()
	MOVQ(scratch, sp)
	for t := range 4 {
		tilestored(t, sp, line)
		ADDQ(U32(1024), sp)
	}
	// Tile 2i+j (weight group i, activation group j) to out + 64·i +
	// 16·ldo·j, a column (activation row) at a time.
	o, sums := GP64(), GP64()
	for t := range 4 {
		i, g := t/2, t%2
		MOVQ(out, o)
		if i == 1 {
			ADDQ(U32(64), o)
		}
		if g == 1 {
			tt := GP64()
			MOVQ(ldo, tt)
			SHLQ(U8(4), tt)
			ADDQ(tt, o)
		}
		MOVQ(scratch, sums)
		ADDQ(U32(1024*t), sums)
		storeColumns(fmt.Sprintf("column%d", t), sums, o, ldo, a.zidx, U32(16))
	}
	nextWeightRows(a, 32)
}

// qamxKR16 emits the AMX dot kernel of the K-quants' widened panels (the
// pack kernels' layouts: quantk.go's pk for Q4_K/Q5_K, qamxKR16, and p6
// for Q6_K, qamx6KR16) for 16 activation rows: per super-block, one
// TDPBSUD per sub-block (32 levels, or Q6_K's 16) of the signed activation
// bytes by the unsigned levels, each 16×16 int32 tile stored to scratch
// (8 or 16 KiB); then per activation row the exact integers of dotK (I =
// Σ scale·S, M = Σ min·Σx by VPDPWSSD, or for Q6_K I −= 32·Σ scale·Σx)
// and its FMAs, so every output is the other quantized kernels' bits. Its
// meta is the 16 rows' 64-byte records per super-block side by side
// (package tensor's qAct.prepareAMX); its configuration amxConfig32's (or for
// Q6_K amxConfig16's: tile A 16 bytes a row, tile B 4 rows).
func qamxKR16(six bool) {
	const rows = 16
	name, what := "qamxKR16", "Q4_K/Q5_K"
	sub, subs, pb := 32, 8, pkBytes
	if six {
		name, what = "qamx6KR16", "Q6_K"
		sub, subs, pb = 16, 16, p6Bytes
	}
	TEXT(name, NOSPLIT, int8AMXSig)
	Doc(fmt.Sprintf("%s continues the 16-lane f32 chains of 16 activation rows over nb super-blocks of a widened %s panel with AMX (see asmgen).", name, what))
	x, ldx, meta, panel, nb, accp, scratch, line := loadInt8AMX()
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	xj, pj, sj := GP64(), GP64(), GP64()
	MOVQ(x, xj)
	MOVQ(panel, pj)
	MOVQ(scratch, sj)
	for j := range subs {
		amxBlock(j%2, xj, ldx, pj, line, sj)
		ADDQ(U32(sub), xj)
		ADDQ(U32(16*sub), pj)
		ADDQ(U32(1024), sj)
	}
	scOff, pairOff, pairs, sumOff, dOff := pkScales, pkMins, 4, metaSums32, pkD
	if six {
		scOff, pairOff, pairs, sumOff, dOff = p6Scales, p6Pairs, 8, metaSums16, p6D
	}
	pv := make([]VecVirtual, pairs)
	for i := range pv {
		pv[i] = ZMM()
		VMOVDQU64(Mem{Base: panel, Disp: pairOff + 64*i}, pv[i])
	}
	d := ZMM()
	VMOVUPS(Mem{Base: panel, Disp: dOff}, d)
	var dmin VecVirtual
	if !six {
		dmin = ZMM()
		VMOVUPS(Mem{Base: panel, Disp: pkDmin}, dmin)
	}
	for r := range rows {
		is, t := ZMM(), ZMM()
		for j := range subs {
			sc := ZMM()
			VMOVDQU32(Mem{Base: panel, Disp: scOff + 64*j}, sc)
			if j == 0 {
				VPMULLD(Mem{Base: scratch, Disp: 64 * r}, sc, is)
				continue
			}
			VPMULLD(Mem{Base: scratch, Disp: 1024*j + 64*r}, sc, t)
			VPADDD(t, is, is)
		}
		ms := ZMM()
		VXORPS(ms, ms, ms)
		for i := range pairs {
			vpdpwssd(Mem{Base: meta, Disp: 64*r + sumOff + 4*i}, pv[i], ms, true)
		}
		a := ZMM()
		VMOVUPS(Mem{Base: accp, Disp: 64 * r}, a)
		s, f := ZMM(), ZMM()
		if six {
			VPSLLD(U8(5), ms, ms)
			VPSUBD(ms, is, is)
		}
		VMULPS_BCST(Mem{Base: meta, Disp: 64 * r}, d, s)
		VCVTDQ2PS(is, f)
		VFMADD231PS(s, f, a)
		if !six {
			VMULPS_BCST(Mem{Base: meta, Disp: 64 * r}, dmin, s)
			VCVTDQ2PS(ms, f)
			VFNMADD231PS(s, f, a)
		}
		VMOVUPS(a, Mem{Base: accp, Disp: 64 * r})
	}
	ADDQ(U32(256), x)
	ADDQ(U32(64*rows), meta)
	ADDQ(U32(pb), panel)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	tilerelease()
	VZEROUPPER()
	RET()
}

// amxKernels emits the AMX kernels, and a function returning the entry of
// each (kernelEntry) and of the VDPBF16PS kernels, whose results a test
// compares with the emulator's (Intel's definition).
func amxKernels() {
	gemmAMXBF16()
	gemmAMXBF16x4()
	qamx32R16()
	qamxKR16(false)
	qamxKR16(true)
	peakAMX("peakAMXBF16", "TDPBF16PS", false, tdpbf16ps)
	peakAMX("peakAMXInt8", "TDPBSUD", true, tdpbsud)
	for _, name := range []string{"gemmAMXBF16", "gemmAMXBF16x4", "qamx32R16", "qamxKR16", "qamx6KR16", "peakAMXBF16", "peakAMXInt8", "gemmDPBF16R1", "gemmDPBF16R4"} {
		kernelEntry(name)
	}
}

// kernelEntry emits nameEntry, which returns the address of name's code:
// tests run kernels in an emulator (AMX on CPUs without it).
func kernelEntry(name string) {
	TEXT(name+"Entry", NOSPLIT, "func() *byte")
	Doc(fmt.Sprintf("%sEntry returns the address of %s's code (for tests that run it in an emulator).", name, name))
	r := GP64()
	LEAQ(NewDataAddr(Symbol{Name: "·" + name}, 0), r)
	Store(r, ReturnIndex(0))
	RET()
}

var (
	amxLine = regexp.MustCompile(`^(\s*)(LDTILECFG|TILERELEASE|TILEZERO|TILELOADD|TILESTORED|TDPBSUD|TDPBF16PS)\b\s*(.*)$`)
	gpRegs  = map[string]int{"AX": 0, "CX": 1, "DX": 2, "BX": 3, "SP": 4, "BP": 5, "SI": 6, "DI": 7,
		"R8": 8, "R9": 9, "R10": 10, "R11": 11, "R12": 12, "R13": 13, "R14": 14, "R15": 15}
)

// encodeAMX returns the encoding of an AMX pseudo-instruction as the
// generated assembly prints it (mnemonic, operands: general registers by
// name, tiles as immediates), or an error.
func encodeAMX(mnemonic, operands string) ([]byte, error) {
	var regs, tiles []int
	for _, op := range strings.Split(operands, ",") {
		op = strings.TrimSpace(op)
		if op == "" {
			continue
		}
		if strings.HasPrefix(op, "$") {
			v, err := strconv.ParseInt(op[1:], 0, 8)
			if err != nil || v < 0 || v > 7 {
				return nil, fmt.Errorf("%s: tile operand %q", mnemonic, op)
			}
			tiles = append(tiles, int(v))
			continue
		}
		r, ok := gpRegs[op]
		if !ok {
			return nil, fmt.Errorf("%s: operand %q is not a general register", mnemonic, op)
		}
		regs = append(regs, r)
	}
	want := map[string][2]int{"LDTILECFG": {1, 0}, "TILERELEASE": {0, 0}, "TILEZERO": {0, 1},
		"TILELOADD": {2, 1}, "TILESTORED": {2, 1}, "TDPBSUD": {0, 3}, "TDPBF16PS": {0, 3}}[mnemonic]
	if len(regs) != want[0] || len(tiles) != want[1] {
		return nil, fmt.Errorf("%s: want %d registers and %d tiles, got %q", mnemonic, want[0], want[1], operands)
	}
	switch mnemonic {
	case "LDTILECFG": // VEX.128.NP.0F38.W0 49 !(11):000:bbb
		return vex3(0, 0, 0, regs[0], 0, 0x49, memOperand(0, regs[0], -1)), nil
	case "TILERELEASE": // VEX.128.NP.0F38.W0 49 C0
		return vex3(0, 0, 0, 0, 0, 0x49, []byte{0xc0}), nil
	case "TILEZERO": // VEX.128.F2.0F38.W0 49 11:rrr:000
		return vex3(3, 0, 0, 0, 0, 0x49, []byte{0xc0 | byte(tiles[0])<<3}), nil
	case "TILELOADD", "TILESTORED": // VEX.128.F2 (load) or F3 (store).0F38.W0 4B !(11):rrr:100, base + index·1
		pp := byte(3)
		if mnemonic == "TILESTORED" {
			pp = 2
		}
		if regs[1] == 4 {
			return nil, fmt.Errorf("%s: SP cannot be an index", mnemonic)
		}
		return vex3(pp, 0, regs[1], regs[0], 0, 0x4b, memOperand(tiles[0], regs[0], regs[1])), nil
	case "TDPBSUD", "TDPBF16PS": // VEX.128.F3.0F38.W0 5E (5C) 11:rrr(C):bbb(A), vvvv B
		op := byte(0x5e)
		if mnemonic == "TDPBF16PS" {
			op = 0x5c
		}
		return vex3(2, 0, 0, 0, tiles[2], op, []byte{0xc0 | byte(tiles[0])<<3 | byte(tiles[1])}), nil
	}
	return nil, fmt.Errorf("%s: unknown", mnemonic)
}

// vex3 returns a three-byte VEX prefix (map 0F38, W0, 128-bit) with
// mandatory prefix pp (0 none, 1 66, 2 F3, 3 F2), the high bits of ModRM.reg
// (r), SIB.index (x) and ModRM.rm or SIB.base (b), the second source vvvv,
// then the opcode and rest (ModRM and what follows).
func vex3(pp byte, r, x, b, vvvv int, opcode byte, rest []byte) []byte {
	bit := func(v int) byte { return byte(v>>3) & 1 }
	p1 := (1-bit(r))<<7 | (1-bit(x))<<6 | (1-bit(b))<<5 | 0b00010
	p2 := (^byte(vvvv)&0b1111)<<3 | pp
	return append([]byte{0xc4, p1, p2, opcode}, rest...)
}

// memOperand returns ModRM (reg field reg) and what follows for the memory
// operand [base] (index < 0) or [base + index·1]: a SIB byte where needed,
// and a zero 8-bit displacement where the base is BP or R13 (which mod 00
// does not allow).
func memOperand(reg, base, index int) []byte {
	mod := byte(0)
	if base&7 == 5 {
		mod = 1
	}
	var out []byte
	switch {
	case index >= 0:
		out = []byte{mod<<6 | byte(reg&7)<<3 | 4, byte(index&7)<<3 | byte(base&7)}
	case base&7 == 4:
		out = []byte{mod<<6 | byte(reg&7)<<3 | 4, 0x24}
	default:
		out = []byte{mod<<6 | byte(reg&7)<<3 | byte(base&7)}
	}
	if mod == 1 {
		out = append(out, 0)
	}
	return out
}
