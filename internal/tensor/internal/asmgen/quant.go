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
// rowquant.go instead, which read the weights row after row.
//
// Measured on the Emerald Rapids this was first tuned on: VPDPBUSD zmm
// issues once per cycle, VPMULLD costs two uops, 512-bit shuffles go to
// one port and VPGATHERDD is slow; two accumulators per chain help the
// dependent VPDPBUSDs.

import (
	"fmt"

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
