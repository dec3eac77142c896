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
// activations are quantized by qact8_0/qact8K, bit-identical to the Go
// quantizers. A single activation row (decode) goes to the row kernels of
// rowquant.go instead, which read the weights row after row.
//
// Measured on the Emerald Rapids this was first tuned on: VPDPBUSD zmm
// issues once per cycle, VPMULLD costs two uops, 512-bit shuffles go to
// one port and VPGATHERDD is slow; two accumulators per chain help the
// dependent VPDPBUSDs.

import (
	"fmt"
	"math"

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

// rows16 addresses 16 rows L bytes apart from base: row l at
// bases[l/4] + (l%4)·L, with 3L in a register.
type rows16 struct {
	bases [4]GPVirtual
	L, L3 GPVirtual
}

func newRows16(base, L GPVirtual) rows16 {
	var r rows16
	r.L = L
	r.L3 = GP64()
	LEAQ(Mem{Base: L, Index: L, Scale: 2}, r.L3)
	r.bases[0] = base
	for g := 1; g < 4; g++ {
		r.bases[g] = GP64()
		LEAQ(Mem{Base: r.bases[g-1], Index: L, Scale: 4}, r.bases[g])
	}
	return r
}

// at returns the address of row l at displacement disp.
func (r rows16) at(l, disp int) Mem {
	m := Mem{Base: r.bases[l/4], Disp: disp}
	switch l % 4 {
	case 1:
		m.Index, m.Scale = r.L, 1
	case 2:
		m.Index, m.Scale = r.L, 2
	case 3:
		m.Index, m.Scale = r.L3, 1
	}
	return m
}

func (r rows16) advance(bytes int) {
	for _, b := range r.bases {
		ADDQ(U32(bytes), b)
	}
}

// transpose16x8 loads 8 dwords at disp of each of the 16 rows and returns
// t[i], whose lane l is dword i of row l.
func transpose16x8(r rows16, disp int) [8]VecVirtual {
	// z[g] holds rows g and g+4 (g < 4), z[4+g] rows 8+g and 12+g.
	var z [8]VecVirtual
	for g := range 4 {
		for h := range 2 {
			z[4*h+g] = ZMM()
			// A broadcast writes the whole register (a YMM load would
			// leave the upper half live for the register allocator).
			VBROADCASTI64X4(r.at(8*h+g, disp), z[4*h+g])
			VINSERTI64X4(U8(1), r.at(8*h+g+4, disp), z[4*h+g], z[4*h+g])
		}
	}
	var t [8]VecVirtual
	for h := range 2 {
		q := z[4*h : 4*h+4]
		a := [4]VecVirtual{ZMM(), ZMM(), ZMM(), ZMM()}
		VPUNPCKLDQ(q[1], q[0], a[0])
		VPUNPCKHDQ(q[1], q[0], a[1])
		VPUNPCKLDQ(q[3], q[2], a[2])
		VPUNPCKHDQ(q[3], q[2], a[3])
		b := [4]VecVirtual{ZMM(), ZMM(), ZMM(), ZMM()}
		VPUNPCKLQDQ(a[2], a[0], b[0])
		VPUNPCKHQDQ(a[2], a[0], b[1])
		VPUNPCKLQDQ(a[3], a[1], b[2])
		VPUNPCKHQDQ(a[3], a[1], b[3])
		// b[i] 128-bit lanes: rows 4h·2+0..3 dword i, dword 4+i, then
		// rows +4.. dword i, dword 4+i.
		for i := range 4 {
			if h == 0 {
				t[i], t[4+i] = b[i], ZMM()
				continue
			}
			lo, hi := ZMM(), ZMM()
			VSHUFI32X4(U8(0x88), b[i], t[i], lo)
			VSHUFI32X4(U8(0xDD), b[i], t[i], hi)
			t[i], t[4+i] = lo, hi
		}
	}
	return t
}

// transpose16x4 loads 4 dwords at disp of each of the 16 rows and returns
// t[i], whose lane l is dword i of row l.
func transpose16x4(r rows16, disp int) [4]VecVirtual {
	// z[g] holds rows g, 4+g, 8+g, 12+g in its 128-bit lanes.
	var z [4]VecVirtual
	for g := range 4 {
		z[g] = ZMM()
		VBROADCASTI32X4(r.at(g, disp), z[g])
		for k := 1; k < 4; k++ {
			VINSERTI32X4(U8(k), r.at(4*k+g, disp), z[g], z[g])
		}
	}
	a := [4]VecVirtual{ZMM(), ZMM(), ZMM(), ZMM()}
	VPUNPCKLDQ(z[1], z[0], a[0])
	VPUNPCKHDQ(z[1], z[0], a[1])
	VPUNPCKLDQ(z[3], z[2], a[2])
	VPUNPCKHDQ(z[3], z[2], a[3])
	var t [4]VecVirtual
	for i := range t {
		t[i] = ZMM()
	}
	VPUNPCKLQDQ(a[2], a[0], t[0])
	VPUNPCKHQDQ(a[2], a[0], t[1])
	VPUNPCKLQDQ(a[3], a[1], t[2])
	VPUNPCKHQDQ(a[3], a[1], t[3])
	return t
}

// gatherD returns the dword at disp of each of the 16 rows.
func gatherD(r rows16, idx VecVirtual, disp int) VecVirtual {
	k := K()
	KXNORW(k, k, k)
	g := ZMM()
	VPGATHERDD(Mem{Base: r.bases[0], Index: idx, Scale: 1, Disp: disp}, k, g)
	return g
}

// spreadTable emits (once) the table whose entry v (v < 16) has bit k of
// v at bit 4 of byte k: the fifth bits of four Q5_0 levels.
func spreadTable() Mem {
	if spreadMem != nil {
		return *spreadMem
	}
	t := GLOBL("q5spread", RODATA|NOPTR)
	spreadMem = &t
	for v := range 16 {
		var e uint32
		for k := range 4 {
			e |= uint32(v>>k&1) << (8*k + 4)
		}
		DATA(4*v, U32(e))
	}
	return t
}

var spreadMem *Mem

// gatherF16 returns the f16 at disp of each of the 16 rows widened to f32:
// a dword gather (the two bytes after the f16 must be readable) whose low
// halves are converted.
func gatherF16(r rows16, idx VecVirtual, disp int, high bool) VecVirtual {
	k := K()
	KXNORW(k, k, k)
	g := ZMM()
	VPGATHERDD(Mem{Base: r.bases[0], Index: idx, Scale: 1, Disp: disp}, k, g)
	if high {
		VPSRLD(U8(16), g, g)
	}
	h := YMM()
	VPMOVDW(g, h)
	f := ZMM()
	VCVTPH2PS(h, f)
	return f
}

// rowIndex returns the gather index vector l·L for l < 16.
func rowIndex(L GPVirtual) VecVirtual {
	b := ZMM()
	VPBROADCASTD(L.As32(), b)
	idx := ZMM()
	VPMULLD(iotaTable(), b, idx)
	return idx
}

// quant32 describes a dtype with 32-weight blocks for the pack kernel.
type quant32 struct {
	name  string
	bytes int // block size
}

// Panel layout of the 32-weight blocks: per block 8 vectors of levels
// (vector t: levels 4t..4t+3 of every row, unsigned) and the 16 scales.
const (
	panel32Vecs  = 9
	panel32Bytes = 64 * panel32Vecs
)

// packSig is the Go signature of the pack kernels.
const packSig = "func(w *byte, ldw int, nb int, dst *byte, pf uintptr)"

// prefetchNext emits the pack kernels' prefetch for one block step: the
// cache lines of [pf, pf+step) and pf advanced by step. The driver points pf
// at the part of the next group of weight rows (contiguous in memory) that
// corresponds to this call's blocks, so that the matrix is fetched from
// DRAM as one sequential stream a group ahead: reading 8–16 rows side by
// side, as the transposes do, gets a fraction of one stream's bandwidth.
func prefetchNext(pf GPVirtual, step int) {
	for off := 0; off < step+63; off += 64 {
		PREFETCHT0(Mem{Base: pf, Disp: off})
	}
	ADDQ(U32(step), pf)
}

// pack32 emits the pack kernel of Q8_0 (levels + 128), Q4_0 (the nibbles)
// or Q5_0 (nibbles and fifth bits): nb blocks of 16 rows ldw bytes apart
// into dst.
func pack32(q quant32) {
	name := "qpack" + q.name + "AVX512"
	TEXT(name, NOSPLIT, packSig)
	Doc(fmt.Sprintf("%s packs nb %s blocks of 16 weight rows ldw bytes apart into a panel at dst and prefetches as many bytes from pf (see asmgen).", name, q.name))
	w := Load(Param("w"), GP64()).(GPVirtual)
	L := Load(Param("ldw"), GP64()).(GPVirtual)
	nb := Load(Param("nb"), GP64())
	dst := Load(Param("dst"), GP64())
	pf := Load(Param("pf"), GP64()).(GPVirtual)
	r := newRows16(w, L)
	idx := rowIndex(L)
	var c VecVirtual
	if q.bytes == 34 {
		c = splat(0x80808080)
	} else {
		c = splat(0x0f0f0f0f)
	}
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	prefetchNext(pf, 16*q.bytes)
	switch q.bytes {
	case 34:
		t := transpose16x8(r, 2)
		for i, v := range t {
			VPXORD(c, v, v)
			VMOVDQU64(v, Mem{Base: dst, Disp: 64 * i})
		}
	case 22:
		// Q5_0: nibbles at 6, the 32 fifth bits at 2.
		qh := gatherD(r, idx, 2)
		for i, v := range transpose16x4(r, 6) {
			hi := ZMM()
			VPSRLD(U8(4), v, hi)
			VPANDD(c, v, v)
			VPANDD(c, hi, hi)
			for h, lv := range []VecVirtual{v, hi} {
				b := shifted(qh, -(16*h + 4*i))
				if b == qh {
					b = ZMM()
					VMOVDQA64(qh, b)
				}
				VPERMD(spreadTable(), b, b)
				VPORD(b, lv, lv)
			}
			VMOVDQU64(v, Mem{Base: dst, Disp: 64 * i})
			VMOVDQU64(hi, Mem{Base: dst, Disp: 64 * (4 + i)})
		}
	default:
		t := transpose16x4(r, 2)
		for i, v := range t {
			hi := ZMM()
			VPSRLD(U8(4), v, hi)
			VPANDD(c, v, v)
			VPANDD(c, hi, hi)
			VMOVDQU64(v, Mem{Base: dst, Disp: 64 * i})
			VMOVDQU64(hi, Mem{Base: dst, Disp: 64 * (4 + i)})
		}
	}
	VMOVUPS(gatherF16(r, idx, 0, false), Mem{Base: dst, Disp: 512})
	r.advance(q.bytes)
	ADDQ(U32(panel32Bytes), dst)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// actRows addresses up to 8 activation rows (or their metadata) L bytes
// apart: row r at base[r/4] + (r%4)·L.
type actRows struct {
	bases []GPVirtual
	L, L3 GPVirtual
}

func newActRows(base, L GPVirtual, rows int) actRows {
	a := actRows{bases: []GPVirtual{base}, L: L}
	if rows > 3 {
		a.L3 = GP64()
		LEAQ(Mem{Base: L, Index: L, Scale: 2}, a.L3)
	}
	if rows > 4 {
		b := GP64()
		LEAQ(Mem{Base: base, Index: L, Scale: 4}, b)
		a.bases = append(a.bases, b)
	}
	return a
}

func (a actRows) at(r, disp int) Mem {
	m := Mem{Base: a.bases[r/4], Disp: disp}
	switch r % 4 {
	case 1:
		m.Index, m.Scale = a.L, 1
	case 2:
		m.Index, m.Scale = a.L, 2
	case 3:
		m.Index, m.Scale = a.L3, 1
	}
	return m
}

func (a actRows) advance(bytes int) {
	for _, b := range a.bases {
		ADDQ(U32(bytes), b)
	}
}

// maxDot32Rows is the largest number of activation rows one dot32 kernel
// takes.
const maxDot32Rows = 8

// dot32Sig is the Go signature of the dot kernels.
const dotSig = "func(x *int8, ldx int, meta *uint32, ldm int, panel *byte, nb int, acc *float32)"

// dot32 emits the dot kernel for rows activation rows and panels of
// 32-weight blocks: for each block b, for each row r, I = corr_rb + Σ
// VPDPBUSD(levels, x bytes), acc_r = fma(float(I), scales·dx_rb, acc_r).
// acc holds rows×16 f32 chains (row r at acc+64r), loaded and stored.
func dot32(rows int) {
	name := fmt.Sprintf("qdot32AVX512R%d", rows)
	TEXT(name, NOSPLIT, dotSig)
	Doc(fmt.Sprintf("%s continues the 16-lane f32 chains of %d activation rows over nb blocks of a Q8_0/Q4_0 panel (see asmgen).", name, rows))
	x := newActRows(Load(Param("x"), GP64()).(GPVirtual), Load(Param("ldx"), GP64()).(GPVirtual), rows)
	m := newActRows(Load(Param("meta"), GP64()).(GPVirtual), Load(Param("ldm"), GP64()).(GPVirtual), rows)
	panel := Load(Param("panel"), GP64())
	nb := Load(Param("nb"), GP64())
	accp := Load(Param("acc"), GP64())
	acc := make([]VecVirtual, rows)
	for r := range acc {
		acc[r] = ZMM()
		VMOVUPS(Mem{Base: accp, Disp: 64 * r}, acc[r])
	}
	TESTQ(nb, nb)
	JE(LabelRef("store"))
	Label("block")
	is := make([]VecVirtual, rows)
	for r := range is {
		is[r] = ZMM()
		VPBROADCASTD(m.at(r, 4), is[r])
	}
	for t := range 8 {
		v := ZMM()
		VMOVDQU64(Mem{Base: panel, Disp: 64 * t}, v)
		for r := range rows {
			vpdpbusd(x.at(r, 4*t), v, is[r], true)
		}
	}
	dw := ZMM()
	VMOVUPS(Mem{Base: panel, Disp: 512}, dw)
	for r := range rows {
		s := ZMM()
		VMULPS_BCST(m.at(r, 0), dw, s)
		f := ZMM()
		VCVTDQ2PS(is[r], f)
		VFMADD231PS(s, f, acc[r])
	}
	x.advance(32)
	m.advance(8)
	ADDQ(U32(panel32Bytes), panel)
	DECQ(nb)
	JNE(LabelRef("block"))
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
	packQ4K(false)
	packQ4K(true)
	packQ6K()
	for r := 1; r <= maxDotKRows; r++ {
		dotK(r, false)
		dotK(r, true)
	}
	qact8_0()
	qact8K()
}

// Panel layout of a Q4_K/Q5_K super-block (offsets in bytes): 64 vectors
// of levels (vector 8j+t: levels 4t..4t+3 of sub-block j of every row),
// the 8 sub-block scales as int32, the mins as 4 vectors of int16 pairs
// (min 2i in the low half, 2i+1 in the high half), then d and dmin as f32.
const (
	pkLevels = 0
	pkScales = 64 * 64
	pkMins   = pkScales + 8*64
	pkD      = pkMins + 4*64
	pkDmin   = pkD + 64
	pkBytes  = pkDmin + 64
)

// Panel layout of a Q6_K super-block: 64 vectors of levels (vector 4s+t:
// levels 4t..4t+3 of sub-block s of 16, as 0..63), the 16 scales as int32,
// the scales as 8 vectors of int16 pairs, then d as f32.
const (
	p6Levels = 0
	p6Scales = 64 * 64
	p6Pairs  = p6Scales + 16*64
	p6D      = p6Pairs + 8*64
	p6Bytes  = p6D + 64
)

// ternAorB is the VPTERNLOGD function (A & C) | B.
const ternAorB = 0xEC

// shifted returns v shifted left by n bits per dword (right for n < 0),
// or v itself for n = 0.
func shifted(v VecVirtual, n int) VecVirtual {
	if n == 0 {
		return v
	}
	t := ZMM()
	if n > 0 {
		VPSLLD(U8(n), v, t)
	} else {
		VPSRLD(U8(-n), v, t)
	}
	return t
}

// shiftedMem returns the vector at m shifted left by n bits per dword
// (right for n < 0, a plain load for n = 0).
func shiftedMem(m Mem, n int) VecVirtual {
	t := ZMM()
	switch {
	case n > 0:
		VPSLLD(U8(n), m, t)
	case n < 0:
		VPSRLD(U8(-n), m, t)
	default:
		VMOVDQU64(m, t)
	}
	return t
}

// stashed stores vs in the stack area at base and returns their addresses
// (the transposes need most registers, so long-lived vectors wait there).
func stashed(base Mem, vs []VecVirtual) []Mem {
	ms := make([]Mem, len(vs))
	for i, v := range vs {
		ms[i] = base.Offset(64 * i)
		VMOVDQU64(v, ms[i])
	}
	return ms
}

// packHeaderK unpacks d, dmin and the 6-bit scales and mins of a Q4_K or
// Q5_K super-block of 16 rows into the panel at dst.
func packHeaderK(r rows16, dst GPVirtual, c63 VecVirtual, bias int) {
	h := transpose16x4(r, 0) // d|dmin, scales 0-3, 4-7, 8-11
	lo := YMM()
	VPMOVDW(h[0], lo)
	d := ZMM()
	VCVTPH2PS(lo, d)
	VMOVUPS(d, Mem{Base: dst, Disp: bias + pkD})
	hi := ZMM()
	VPSRLD(U8(16), h[0], hi)
	VPMOVDW(hi, lo)
	VCVTPH2PS(lo, d)
	VMOVUPS(d, Mem{Base: dst, Disp: bias + pkDmin})
	c0f := splat(0x0f)
	c30 := splat(0x30)
	six := func(j int, mins bool) VecVirtual {
		if j < 4 {
			src := h[1]
			if mins {
				src = h[2]
			}
			v := shifted(src, -8*j)
			if v == src {
				v = ZMM()
				VPANDD(c63, src, v)
			} else {
				VPANDD(c63, v, v)
			}
			return v
		}
		jj := j - 4
		// Low 4 bits from byte jj of scales 8-11 (low or high nibble),
		// high 2 bits from the top of byte jj of scales 0-3 or 4-7.
		lowSh := -8 * jj
		top := h[1]
		if mins {
			lowSh -= 4
			top = h[2]
		}
		a := shifted(h[3], lowSh)
		if a == h[3] {
			a = ZMM()
			VMOVDQA64(h[3], a)
		}
		b := shifted(top, -(8*jj + 2))
		VPANDD(c30, b, b)
		VPTERNLOGD(U8(ternAorB), c0f, b, a)
		return a
	}
	var mins [8]VecVirtual
	for j := range 8 {
		VMOVDQU64(six(j, false), Mem{Base: dst, Disp: bias + pkScales + 64*j})
		mins[j] = six(j, true)
	}
	for i := range 4 {
		VPSLLD(U8(16), mins[2*i+1], mins[2*i+1])
		VPORD(mins[2*i+1], mins[2*i], mins[2*i])
		VMOVDQU64(mins[2*i], Mem{Base: dst, Disp: bias + pkMins + 64*i})
	}
}

// packQ4K emits the pack kernel of Q4_K (or Q5_K with five).
func packQ4K(five bool) {
	name, bytes, qs := "Q4_K", 144, 16
	if five {
		name, bytes, qs = "Q5_K", 176, 48
	}
	fn := "qpack" + name + "AVX512"
	TEXT(fn, NOSPLIT, packSig)
	Doc(fmt.Sprintf("%s packs nb %s super-blocks of 16 weight rows ldw bytes apart into a panel at dst and prefetches as many bytes from pf (see asmgen).", fn, name))
	w := Load(Param("w"), GP64()).(GPVirtual)
	L := Load(Param("ldw"), GP64()).(GPVirtual)
	nb := Load(Param("nb"), GP64())
	dst := Load(Param("dst"), GP64()).(GPVirtual)
	pf := Load(Param("pf"), GP64()).(GPVirtual)
	r := newRows16(w, L)
	c0f := splat(0x0f0f0f0f)
	c63 := splat(63)
	var stash Mem
	if five {
		stash = AllocLocal(8 * 64)
	}
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	prefetchNext(pf, 16*bytes)
	packHeaderK(r, dst, c63, 0)
	var qh []Mem
	var c10 VecVirtual
	if five {
		t := transpose16x8(r, 16)
		qh = stashed(stash, t[:])
		c10 = splat(0x10101010)
	}
	for c := range 4 {
		lv := transpose16x8(r, qs+32*c)
		for t, v := range lv {
			hi := ZMM()
			VPSRLD(U8(4), v, hi)
			if !five {
				VPANDD(c0f, v, v)
				VPANDD(c0f, hi, hi)
			} else {
				// Fifth bits: bit 2c of each qh byte for the low
				// nibbles, bit 2c+1 for the high ones, moved to bit 4.
				b := shiftedMem(qh[t], 4-2*c)
				VPANDD(c10, b, b)
				VPTERNLOGD(U8(ternAorB), c0f, b, v)
				b2 := shiftedMem(qh[t], 3-2*c)
				VPANDD(c10, b2, b2)
				VPTERNLOGD(U8(ternAorB), c0f, b2, hi)
			}
			VMOVDQU64(v, Mem{Base: dst, Disp: pkLevels + 64*(8*(2*c)+t)})
			VMOVDQU64(hi, Mem{Base: dst, Disp: pkLevels + 64*(8*(2*c+1)+t)})
		}
	}
	r.advance(bytes)
	ADDQ(U32(pkBytes), dst)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// packQ6K emits the pack kernel of Q6_K.
func packQ6K() {
	const bytes = 210
	TEXT("qpackQ6_KAVX512", NOSPLIT, packSig)
	Doc("qpackQ6_KAVX512 packs nb Q6_K super-blocks of 16 weight rows ldw bytes apart into a panel at dst and prefetches as many bytes from pf (see asmgen).")
	w := Load(Param("w"), GP64()).(GPVirtual)
	L := Load(Param("ldw"), GP64()).(GPVirtual)
	nb := Load(Param("nb"), GP64())
	dst := Load(Param("dst"), GP64()).(GPVirtual)
	pf := Load(Param("pf"), GP64()).(GPVirtual)
	r := newRows16(w, L)
	idx := rowIndex(L)
	c0f := splat(0x0f0f0f0f)
	c30 := splat(0x30303030)
	cLo := splat(0xffff)
	stash := AllocLocal(8 * 64)
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	prefetchNext(pf, 16*bytes)
	// Scales: sign-extended int32 and int16 pairs; d from the top half
	// of the dword at 206 (scales 14, 15, then d).
	sc := transpose16x4(r, 192)
	var s32 [16]VecVirtual
	for i := range 4 {
		for k := range 4 {
			v := ZMM()
			if k < 3 {
				VPSLLD(U8(24-8*k), sc[i], v)
				VPSRAD(U8(24), v, v)
			} else {
				VPSRAD(U8(24), sc[i], v)
			}
			s32[4*i+k] = v
			VMOVDQU64(v, Mem{Base: dst, Disp: p6Scales + 64*(4*i+k)})
		}
	}
	for i := range 8 {
		VPSLLD(U8(16), s32[2*i+1], s32[2*i+1])
		VPTERNLOGD(U8(ternAorB), cLo, s32[2*i+1], s32[2*i])
		VMOVDQU64(s32[2*i], Mem{Base: dst, Disp: p6Pairs + 64*i})
	}
	VMOVUPS(gatherF16(r, idx, 206, true), Mem{Base: dst, Disp: p6D})
	for h := range 2 {
		t := transpose16x8(r, 128+32*h)
		qh := stashed(stash, t[:])
		for qq := range 2 {
			ql := transpose16x8(r, 64*h+32*qq)
			for t, v := range ql {
				// Quarter qq takes the low nibbles, quarter qq+2 the
				// high ones; their top bits are bits 2q, 2q+1 of qh.
				hi := ZMM()
				VPSRLD(U8(4), v, hi)
				for _, q := range []int{qq, qq + 2} {
					b := shiftedMem(qh[t], 4-2*q)
					VPANDD(c30, b, b)
					lv := v
					if q >= 2 {
						lv = hi
					}
					VPTERNLOGD(U8(ternAorB), c0f, b, lv)
					VMOVDQU64(lv, Mem{Base: dst, Disp: p6Levels + 64*(32*h+8*q+t)})
				}
			}
		}
	}
	r.advance(bytes)
	ADDQ(U32(p6Bytes), dst)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// maxDotKRows is the largest number of activation rows one K-quant dot
// kernel takes.
const maxDotKRows = 6

// K-quant activation metadata per super-block (bytes): the f32 scale, the
// int16 sums of 32 as pairs, the int16 sums of 16 as pairs.
const (
	metaKBytes = 64
	metaSums32 = 16
	metaSums16 = 32
)

// dotK emits the dot kernel for rows activation rows and panels of
// Q4_K/Q5_K super-blocks (or Q6_K ones with six): per super-block and row,
// the exact I (Σ scale·Σ q·x) and M (Σ min·Σ x, or for Q6_K the offset
// term), then acc = fma(float(I), d·dy, acc) and acc = fma(−float(M),
// dmin·dy, acc).
func dotK(rows int, six bool) {
	name := fmt.Sprintf("qdotKAVX512R%d", rows)
	what := "Q4_K/Q5_K"
	sub, subs, pb := 32, 8, pkBytes
	if six {
		name = fmt.Sprintf("qdot6KAVX512R%d", rows)
		what = "Q6_K"
		sub, subs, pb = 16, 16, p6Bytes
	}
	TEXT(name, NOSPLIT, dotSig)
	Doc(fmt.Sprintf("%s continues the 16-lane f32 chains of %d activation rows over nb super-blocks of a %s panel (see asmgen).", name, rows, what))
	x := newActRows(Load(Param("x"), GP64()).(GPVirtual), Load(Param("ldx"), GP64()).(GPVirtual), rows)
	m := newActRows(Load(Param("meta"), GP64()).(GPVirtual), Load(Param("ldm"), GP64()).(GPVirtual), rows)
	panel := Load(Param("panel"), GP64())
	nb := Load(Param("nb"), GP64())
	accp := Load(Param("acc"), GP64())
	acc := make([]VecVirtual, rows)
	for r := range acc {
		acc[r] = ZMM()
		VMOVUPS(Mem{Base: accp, Disp: 64 * r}, acc[r])
	}
	TESTQ(nb, nb)
	JE(LabelRef("store"))
	Label("block")
	is := make([]VecVirtual, rows)
	for j := range subs {
		ds := make([]VecVirtual, rows)
		for r := range rows {
			ds[r] = ZMM()
			VXORPS(ds[r], ds[r], ds[r]) // avo knows this zeroing idiom
		}
		for t := range sub / 4 {
			v := ZMM()
			VMOVDQU64(Mem{Base: panel, Disp: 64 * (sub/4*j + t)}, v)
			for r := range rows {
				vpdpbusd(x.at(r, sub*j+4*t), v, ds[r], true)
			}
		}
		scOff := pkScales
		if six {
			scOff = p6Scales
		}
		for r := range rows {
			if j == 0 {
				is[r] = ZMM()
				VPMULLD(Mem{Base: panel, Disp: scOff + 64*j}, ds[r], is[r])
				continue
			}
			VPMULLD(Mem{Base: panel, Disp: scOff + 64*j}, ds[r], ds[r])
			VPADDD(ds[r], is[r], is[r])
		}
	}
	// The second integer: Σ min·(Σ x per 32) from int16 pairs, or for
	// Q6_K Σ scale·(Σ x per 16), whose 32-fold is subtracted from I.
	ms := make([]VecVirtual, rows)
	for r := range rows {
		ms[r] = ZMM()
		VXORPS(ms[r], ms[r], ms[r])
	}
	pairs, pairOff, sumOff := 4, pkMins, metaSums32
	if six {
		pairs, pairOff, sumOff = 8, p6Pairs, metaSums16
	}
	for i := range pairs {
		v := ZMM()
		VMOVDQU64(Mem{Base: panel, Disp: pairOff + 64*i}, v)
		for r := range rows {
			vpdpwssd(m.at(r, sumOff+4*i), v, ms[r], true)
		}
	}
	dOff := pkD
	if six {
		dOff = p6D
	}
	d := ZMM()
	VMOVUPS(Mem{Base: panel, Disp: dOff}, d)
	var dmin VecVirtual
	if !six {
		dmin = ZMM()
		VMOVUPS(Mem{Base: panel, Disp: pkDmin}, dmin)
	}
	for r := range rows {
		if six {
			VPSLLD(U8(5), ms[r], ms[r])
			VPSUBD(ms[r], is[r], is[r])
		}
		s := ZMM()
		VMULPS_BCST(m.at(r, 0), d, s)
		f := ZMM()
		VCVTDQ2PS(is[r], f)
		VFMADD231PS(s, f, acc[r])
		if !six {
			VMULPS_BCST(m.at(r, 0), dmin, s)
			VCVTDQ2PS(ms[r], f)
			VFNMADD231PS(s, f, acc[r])
		}
	}
	x.advance(256)
	m.advance(metaKBytes)
	ADDQ(U32(pb), panel)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("store")
	for r := range acc {
		VMOVUPS(acc[r], Mem{Base: accp, Disp: 64 * r})
	}
	VZEROUPPER()
	RET()
}

// hmaxPS returns an XMM whose low lane is the largest of the 16 lanes of
// v (no NaNs among them).
func hmaxPS(v VecVirtual) VecVirtual {
	y := YMM()
	VEXTRACTF32X8(U8(1), v, y)
	VMAXPS(y, v.AsY(), y)
	x := XMM()
	VEXTRACTF128(U8(1), y, x)
	VMAXPS(x, y.AsX(), x)
	x2 := XMM()
	VMOVHLPS(x, x, x2)
	VMAXPS(x2, x, x2)
	x3 := XMM()
	VMOVSHDUP(x2, x3)
	VMAXSS(x3, x2, x3)
	return x3
}

// hsumD returns a GP register holding the sum of the 16 int32 lanes of v.
func hsumD(v VecVirtual) GPVirtual {
	y := YMM()
	VEXTRACTI64X4(U8(1), v, y)
	VPADDD(y, v.AsY(), y)
	x := XMM()
	VEXTRACTI128(U8(1), y, x)
	VPADDD(x, y.AsX(), x)
	x2 := XMM()
	VPSHUFD(U8(0x4e), x, x2)
	VPADDD(x2, x, x2)
	x3 := XMM()
	VPSHUFD(U8(0xb1), x2, x3)
	VPADDD(x3, x2, x3)
	g := GP32()
	VMOVD(x3, g)
	return g
}

// splatF returns a ZMM holding f in every lane.
func splatF(f float32) VecVirtual { return splat(math.Float32bits(f)) }

// qact8_0 emits the AVX-512 activation quantizer for Q8_0/Q4_0 weights:
// ggml's q8_0 per 32 values, exactly as quantizeActQ8_0 does it for finite
// inputs (round half away from zero as a truncation plus a correction, so
// it matches math.Round).
func qact8_0() {
	TEXT("qactQ8_0AVX512", NOSPLIT, "func(x *float32, nb int, q *int8, meta *uint32, corrMul int)")
	Doc("qactQ8_0AVX512 quantizes nb blocks of 32 activations to q8_0 levels and their scale and correction (see quantizeActQ8_0).")
	x := Load(Param("x"), GP64())
	nb := Load(Param("nb"), GP64())
	q := Load(Param("q"), GP64())
	meta := Load(Param("meta"), GP64())
	cm := Load(Param("corrMul"), GP64())
	absMask := splat(0x7fffffff)
	signMask := splat(0x80000000)
	one := splatF(1)
	half := splatF(0.5)
	c127 := splatF(127)
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	v := [2]VecVirtual{ZMM(), ZMM()}
	VMOVUPS(Mem{Base: x}, v[0])
	VMOVUPS(Mem{Base: x, Disp: 64}, v[1])
	a0, a1 := ZMM(), ZMM()
	VANDPS(absMask, v[0], a0)
	VANDPS(absMask, v[1], a1)
	VMAXPS(a1, a0, a0)
	amax := hmaxPS(a0)
	d := XMM()
	VDIVSS(c127.AsX(), amax, d)
	id := XMM()
	VDIVSS(d, one.AsX(), id)
	z := XMM()
	VXORPS(z, z, z)
	isZero := XMM()
	VCMPSS(U8(0), z, d, isZero) // d == 0
	VANDNPS(id, isZero, id)
	h := XMM()
	VCVTPS2PH(U8(0), d, h)
	VCVTPH2PS(h, d)
	VMOVSS(d, Mem{Base: meta})
	ib := ZMM()
	VBROADCASTSS(id, ib)
	var iv [2]VecVirtual
	for i := range 2 {
		p := ZMM()
		VMULPS(ib, v[i], p)
		t := ZMM()
		VRNDSCALEPS(U8(0x0b), p, t) // truncate
		f := ZMM()
		VSUBPS(t, p, f)
		VANDPS(absMask, f, f)
		k := K()
		VCMPPS(U8(0x1d), half, f, k) // |p − t| ≥ 0.5
		s := ZMM()
		VMOVAPS(one, s)
		VPTERNLOGD(U8(0xf8), signMask, p, s) // ±1 with p's sign
		VADDPS(s, t, k, t)
		iv[i] = ZMM()
		VCVTTPS2DQ(t, iv[i])
		b := XMM()
		VPMOVSDB(iv[i], b)
		VMOVDQU(b, Mem{Base: q, Disp: 16 * i})
	}
	VPADDD(iv[1], iv[0], iv[0])
	sum := hsumD(iv[0])
	IMULL(cm.(GPVirtual).As32(), sum)
	MOVL(sum, Mem{Base: meta, Disp: 4})
	ADDQ(U32(128), x)
	ADDQ(U32(32), q)
	ADDQ(U32(8), meta)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// qact8K emits the AVX-512 activation quantizer for the K-quants: ggml's
// q8_K per 256 values, exactly as quantizeActQ8K does it for finite
// inputs, with the sums per 16 (and 32) from VPSADBW.
func qact8K() {
	TEXT("qactQ8KAVX512", NOSPLIT, "func(x *float32, nb int, q *int8, meta *uint32)")
	Doc("qactQ8KAVX512 quantizes nb blocks of 256 activations to q8_K levels, scale and sums (see quantizeActQ8K).")
	x := Load(Param("x"), GP64())
	nb := Load(Param("nb"), GP64())
	q := Load(Param("q"), GP64())
	meta := Load(Param("meta"), GP64())
	absMask := splat(0x7fffffff)
	TESTQ(nb, nb)
	JE(LabelRef("done"))
	Label("block")
	m := ZMM()
	VXORPS(m, m, m)
	for v := range 16 {
		a := ZMM()
		VANDPS(Mem{Base: x, Disp: 64 * v}, absMask, a)
		VMAXPS(m, a, m) // a NaN lane keeps m
	}
	amax := hmaxPS(m)
	z := XMM()
	VXORPS(z, z, z)
	zero := ZMM()
	VXORPS(zero, zero, zero)
	VUCOMISS(z, amax)
	JNE(LabelRef("nonzero"))
	for i := range 4 {
		VMOVDQU64(zero, Mem{Base: q, Disp: 64 * i})
	}
	VMOVDQU64(zero, Mem{Base: meta})
	JMP(LabelRef("next"))
	Label("nonzero")
	// The first value of largest magnitude gives the scale its sign.
	amaxV := ZMM()
	VBROADCASTSS(amax, amaxV)
	i, bits := GP64(), GP32()
	XORQ(i, i)
	Label("find")
	a := ZMM()
	VANDPS(Mem{Base: x, Index: i, Scale: 4}, absMask, a)
	k := K()
	VCMPPS(U8(0), amaxV, a, k) // equal
	KMOVW(k, bits)
	TESTL(bits, bits)
	JNE(LabelRef("found"))
	ADDQ(U8(16), i)
	JMP(LabelRef("find"))
	Label("found")
	at := GP32()
	BSFL(bits, at)
	ADDL(i.As32(), at)
	mx := XMM()
	VMOVSS(Mem{Base: x, Index: at.As64(), Scale: 4}, mx)
	is := XMM()
	VDIVSS(mx, splatF(-127).AsX(), is)
	isb := ZMM()
	VBROADCASTSS(is, isb)
	c127 := splat(127)
	for v := range 16 {
		p := ZMM()
		VMULPS(Mem{Base: x, Disp: 64 * v}, isb, p)
		iv := ZMM()
		VCVTPS2DQ(p, iv) // nearest, ties to even
		VPMINSD(c127, iv, iv)
		b := XMM()
		VPMOVSDB(iv, b)
		VMOVDQU(b, Mem{Base: q, Disp: 16 * v})
	}
	d := XMM()
	VDIVSS(is, splatF(1).AsX(), d)
	VMOVDQU64(zero, Mem{Base: meta})
	VMOVSS(d, Mem{Base: meta})
	// Sums per 16: VPSADBW of the levels + 128 sums 8 of them per qword.
	c80 := splat(0x80808080)
	var s [4]VecVirtual
	for v := range 4 {
		s[v] = ZMM()
		VPXORD(Mem{Base: q, Disp: 64 * v}, c80, s[v])
		VPSADBW(zero, s[v], s[v])
	}
	var w [2]VecVirtual
	for p := range 2 {
		lo, hi := ZMM(), ZMM()
		VPUNPCKLQDQ(s[2*p+1], s[2*p], lo)
		VPUNPCKHQDQ(s[2*p+1], s[2*p], hi)
		VPADDQ(hi, lo, lo)
		w[p] = XMM()
		VPMOVQW(lo, w[p]) // groups 8p + [0 4 1 5 2 6 3 7]
	}
	ws := YMM()
	VINSERTI32X4(U8(1), w[1], w[0].AsY(), ws)
	order := YMM()
	VMOVDQU(sumsOrder(), order)
	VPERMW(ws, order, ws)
	VPSUBW(splat(0x08000800).AsY(), ws, ws) // 16·128 per group
	VMOVDQU(ws, Mem{Base: meta, Disp: metaSums16})
	VPMADDWD(splat(0x00010001).AsY(), ws, ws)
	s32 := XMM()
	VPMOVDW(ws, s32)
	VMOVDQU(s32, Mem{Base: meta, Disp: metaSums32})
	Label("next")
	ADDQ(U32(1024), x)
	ADDQ(U32(256), q)
	ADDQ(U32(metaKBytes), meta)
	DECQ(nb)
	JNE(LabelRef("block"))
	Label("done")
	VZEROUPPER()
	RET()
}

// sumsOrderMem is the word permutation table of qact8K, once emitted.
var sumsOrderMem *Mem

// sumsOrder emits (once) the VPERMW indices that put the group sums of
// qact8K in order: group g sits at word 2g (g < 4), 2(g−4)+1 (g < 8), and
// likewise +8 for the second half.
func sumsOrder() Mem {
	if sumsOrderMem != nil {
		return *sumsOrderMem
	}
	t := GLOBL("sums16order", RODATA|NOPTR)
	sumsOrderMem = &t
	for g := range 16 {
		h, r := g/8*8, g%8
		pos := h + 2*r
		if r >= 4 {
			pos = h + 2*(r-4) + 1
		}
		DATA(2*g, U16(uint16(pos)))
	}
	return t
}
