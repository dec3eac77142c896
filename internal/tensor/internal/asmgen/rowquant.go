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
// distant regions of the matrix side by side: see rowstreams.go), and
// works in two phases:
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
}

// paramMem returns the stack address of the parameter name.
func paramMem(name string) Mem {
	b, err := Param(name).Resolve()
	if err != nil {
		panic(err)
	}
	return b.Addr
}

// slotBytes is the scratch size of one group of one row: pairs f32
// vectors of the integers, then pairs of the scale products.
func (k rowKern) slotBytes() int { return 2 * k.pairs * 4 * k.group }

// ymmZero returns a zeroed YMM.
func ymmZero() VecVirtual {
	v := YMM()
	VXORPS(v, v, v)
	return v
}

// splatY returns a YMM holding the dword v in every lane.
func (k rowKern) splatY(v uint32) VecVirtual {
	if !k.avx512 {
		return splat8(v)
	}
	g := GP32()
	MOVL(U32(v), g)
	y := YMM()
	VPBROADCASTD(g, y)
	return y
}

// movdqu emits a 256-bit integer move (EVEX-encodable on AVX-512, where
// the register allocator may hand out Y16–Y31).
func (k rowKern) movdqu(src, dst Op) {
	if k.avx512 {
		VMOVDQU64(src, dst)
	} else {
		VMOVDQU(src, dst)
	}
}

// bcast128 emits dst = the 16 bytes at m in both halves.
func (k rowKern) bcast128(m Mem, dst VecVirtual) {
	if k.avx512 {
		VBROADCASTI32X4(m, dst)
	} else {
		VBROADCASTI128(m, dst)
	}
}

// and emits dst = a & b.
func (k rowKern) and(b Op, a, dst VecVirtual) {
	if k.avx512 {
		VPANDD(b, a, dst)
	} else {
		VPAND(b, a, dst)
	}
}

// tree8 reduces 8 vectors of 8 dword partial sums to one vector whose
// lane t is the sum of p[t]'s lanes (exact integer adds).
func (k rowKern) tree8(p []VecVirtual) VecVirtual {
	b := k.tree4x2(p[:4])
	c := k.tree4x2(p[4:])
	lo, hi := YMM(), YMM()
	if k.avx512 {
		VSHUFI32X4(U8(0b00), c, b, lo)
		VSHUFI32X4(U8(0b11), c, b, hi)
	} else {
		VPERM2I128(U8(0x20), c, b, lo)
		VPERM2I128(U8(0x31), c, b, hi)
	}
	VPADDD(hi, lo, lo)
	return lo
}

// tree4x2 reduces 4 vectors within each 128-bit half: lane t of half h of
// the result is the sum of half h of p[t].
func (k rowKern) tree4x2(p []VecVirtual) VecVirtual { return tree4(p, YMM) }

// tree4 reduces 4 vectors (of any width) within each 128-bit quarter: lane
// t of quarter q of the result is the sum of quarter q of p[t]; vec makes
// the temporaries.
func tree4(p []VecVirtual, vec func() VecVirtual) VecVirtual {
	var a [2]VecVirtual
	for i := range 2 {
		lo, hi := vec(), vec()
		VPUNPCKLDQ(p[2*i+1], p[2*i], lo)
		VPUNPCKHDQ(p[2*i+1], p[2*i], hi)
		VPADDD(hi, lo, lo)
		a[i] = lo
	}
	lo, hi := vec(), vec()
	VPUNPCKLQDQ(a[1], a[0], lo)
	VPUNPCKHQDQ(a[1], a[0], hi)
	VPADDD(hi, lo, lo)
	return lo
}

// row32 emits the row kernel of Q8_0, Q4_0 or Q5_0 (q.bytes 34, 18, 22):
// per block a vector of 32 level bytes made from the block (Q8_0 with
// AVX-512: the levels + 128, as the panel kernels do; Q8_0 with AVX2: the
// raw signed levels, for the sign trick; Q4_0 the nibbles; Q5_0 the
// nibbles with their fifth bits), its dot product with the activation
// block in 8 dword lanes (VPDPBUSD, or VPMADDUBSW and VPMADDWD by ones on
// AVX2), the correction of the unsigned levels (−128·Σx, −8·Σx, −16·Σx,
// from aux) added after the tree.
func row32(avx512 bool, q quant32) {
	k := &rowKern{avx512: avx512, group: 8, pairs: 1, transposed: true}
	k.setStreams(rowStreamsAVX2)
	name := "qrow" + q.name + k.isaName()
	TEXT(name, NOSPLIT, k.sig())
	Doc(fmt.Sprintf("%s computes up to 8 %s weight rows times one activation row (see asmgen's rowquant.go).", name, q.name))
	var c80, ones, c0f, shift, qhSpread, bits, c10 VecVirtual
	signed := q.bytes == 34 && !avx512
	if q.bytes == 34 && avx512 {
		c80 = k.splatY(0x80808080)
	}
	if !avx512 {
		ones = k.splatY(0x00010001)
	}
	if q.bytes != 34 {
		// Low nibbles to bytes 0..15, high ones to 16..31.
		c0f = k.splatY(0x0f0f0f0f)
		shift = YMM()
		k.movdqu(table("shr0x4x4", []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
			4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0}), shift)
	}
	if q.bytes == 22 {
		// Bit t of qh to bit 4 of byte t: byte t/8 of qh spread to the 8
		// bytes 8(t/8).., tested against 1 << t%8.
		var sp, bt []byte
		for t := range 32 {
			sp = append(sp, byte(t/8))
			bt = append(bt, byte(1<<(t%8)))
		}
		qhSpread = YMM()
		k.movdqu(table("q5spreadb", sp), qhSpread)
		bits = YMM()
		k.movdqu(table("q5bits", bt), bits)
		c10 = k.splatY(0x10101010)
	}
	k.phase1(32, q.bytes, func(wq, xq, b, slot GPVirtual) {
		p := make([]VecVirtual, 8)
		for t := range 8 {
			blk := func(d int) Mem { return Mem{Base: wq, Disp: q.bytes*t + d} }
			xm := Mem{Base: xq, Disp: 32 * t}
			if avx512 {
				p[t] = ymmZero() // VPDPBUSD adds to it
			} else {
				p[t] = YMM() // VPMADDWD writes it whole
			}
			if signed {
				// The sign trick: |w|·(x·sign w), pairs exact in int16
				// (at most 2·128·127). The weights are loaded once: a
				// block is 34 bytes, so half its loads cross a line.
				wv, av, xs := YMM(), YMM(), YMM()
				VMOVDQU(blk(2), wv)
				VPABSB(wv, av)
				VMOVDQU(xm, xs)
				VPSIGNB(wv, xs, xs)
				VPMADDUBSW(xs, av, xs)
				VPMADDWD(ones, xs, p[t])
				continue
			}
			v := YMM()
			switch q.bytes {
			case 34:
				VPXORD(blk(2), c80, v)
			default:
				qs := 2
				if q.bytes == 22 {
					qs = 6
				}
				k.bcast128(blk(qs), v)
				VPSRLVD(shift, v, v)
				k.and(c0f, v, v)
				if q.bytes == 22 {
					h := YMM()
					VPBROADCASTD(blk(2), h)
					VPSHUFB(qhSpread, h, h)
					if avx512 {
						km := K()
						VPTESTMB(bits, h, km)
						VPADDB(c10, v, km, v)
					} else {
						VPAND(bits, h, h)
						VPCMPEQB(bits, h, h)
						VPAND(c10, h, h)
						VPOR(h, v, v)
					}
				}
			}
			if avx512 {
				vpdpbusd(xm, v, p[t], false)
			} else {
				VPMADDUBSW(xm, v, v)
				VPMADDWD(ones, v, p[t])
			}
		}
		c := k.tree8(p)
		if !signed {
			corr := k.param("aux")
			LEAQ(Mem{Base: corr, Index: k.nb, Scale: 4}, corr)
			VPADDD(Mem{Base: corr, Index: b, Scale: 4}, c, c)
		}
		f := YMM()
		VCVTDQ2PS(c, f)
		VMOVUPS(f, Mem{Base: slot})
		g := k.halves8(wq, 0, q.bytes)
		VMULPS(Mem{Base: k.param("aux"), Index: b, Scale: 4}, g, g)
		VMOVUPS(g, Mem{Base: slot, Disp: 32})
	})
	k.phase2vec()
	VZEROUPPER()
	RET()
}

// halves8 returns the 8 f16 at disp + stride·t (t < 8) from base,
// widened to f32: loaded into two GP registers, four each, moved over (a
// gather costs ~12 cycles on Zen 4, the GP loads run on otherwise idle
// ports).
func (k rowKern) halves8(base GPVirtual, disp, stride int) VecVirtual {
	lo, hi := pack4x16(base, disp, stride), pack4x16(base, disp+4*stride, stride)
	x := XMM()
	VMOVQ(lo, x)
	VPINSRQ(U8(1), hi, x, x)
	f := YMM()
	VCVTPH2PS(x, f)
	return f
}

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
	for off := 0; off < k.group*bytes+63; off += 64 {
		PREFETCHT0(Mem{Base: wq, Disp: rowPfDist + off})
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

func log2(n int) int {
	l := 0
	for 1<<l < n {
		l++
	}
	if 1<<l != n {
		panic(fmt.Sprintf("log2 of %d", n))
	}
	return l
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

// q6kConsts8 is q6kConsts with the masks in memory.
func (k rowKern) q6kConsts8() q6kConst {
	var m []byte
	for range 32 {
		m = append(m, 0x0f)
	}
	var h []byte
	for range 32 {
		h = append(h, 0x30)
	}
	c := q6kConst{c0f: table("rowc0f", m), c30: table("rowc30", h)}
	c.evenOdd, c.scCtrl = k.q6kTables()
	return c
}

// isaName is the kernel name suffix of the instruction set.
func (k rowKern) isaName() string {
	if k.avx512 {
		return "AVX512"
	}
	return "AVX2"
}

// extractHi returns the high 128 bits of v.
func (k rowKern) extractHi(v VecVirtual) VecVirtual {
	x := XMM()
	if k.avx512 {
		VEXTRACTI32X4(U8(1), v, x)
	} else {
		VEXTRACTI128(U8(1), v, x)
	}
	return x
}

// insertHi returns the YMM whose low half is lo and high half hi.
func (k rowKern) insertHi(lo, hi VecVirtual) VecVirtual {
	y := YMM()
	if k.avx512 {
		VINSERTI32X4(U8(1), hi, lo.AsY(), y)
	} else {
		VINSERTI128(U8(1), hi, lo.AsY(), y)
	}
	return y
}

// pairDot emits acc += Σ pairs of the int16 p times the int16 pairs sc
// (a register, or with bcst a dword in memory broadcast).
func (k rowKern) pairDot(sc Op, bcst bool, p, acc VecVirtual) {
	if k.avx512 {
		vpdpwssd(sc, p, acc, bcst)
		return
	}
	if bcst {
		s := YMM()
		VPBROADCASTD(sc, s)
		sc = s
	}
	VPMADDWD(sc, p, p)
	VPADDD(p, acc, acc)
}

// table emits (once per name) a read-only table of bytes.
func table(name string, b []byte) Mem {
	if m, ok := tables[name]; ok {
		return m
	}
	t := GLOBL(name, RODATA|NOPTR)
	for i, v := range b {
		DATA(i, U8(v))
	}
	tables[name] = t
	return t
}

var tables = map[string]Mem{}

// pack4x16 loads the 16-bit words at disp + stride·t (t < 4) from base
// into one GP register, word t at bits 16t.
func pack4x16(base GPVirtual, disp, stride int) GPVirtual {
	q := GP64()
	MOVWQZX(Mem{Base: base, Disp: disp + 3*stride}, q)
	for t := 2; t >= 0; t-- {
		SHLQ(U8(16), q)
		MOVW(Mem{Base: base, Disp: disp + stride*t}, q.As16())
	}
	return q
}

// pack2x32 loads the dwords at disp and disp + stride from base into one
// GP register.
func pack2x32(base GPVirtual, disp, stride int) GPVirtual {
	q, t := GP64(), GP64()
	MOVL(Mem{Base: base, Disp: disp}, q.As32())
	MOVL(Mem{Base: base, Disp: disp + stride}, t.As32())
	SHLQ(U8(32), t)
	ORQ(t, q)
	return q
}

// rowQ4K emits the Q4_K (or, with five, Q5_K) row kernel. Per super-block
// the 6-bit scales and mins are unpacked in GP registers, the scales
// spread to int16 pairs in a stack slot; the levels (nibbles, with Q5_K
// the fifth bits from qh) times the activations by VPMADDUBSW (exact: at
// most 31·127·2 per pair), times the scales by VPDPWSSD (VPMADDWD and
// VPADDD on AVX2); the mins times the activation sums per 32 by VPMADDWD.
// I (8 lanes folded to 4) and M (4 lanes) of 4 super-blocks share one
// tree: its result is I₀..I₃, M₀..M₃.
func rowQ4K(avx512, five bool) {
	k := &rowKern{avx512: avx512, group: 4, pairs: 2}
	k.setStreams(rowStreamsKAVX2)
	nm, bytes, qs := "Q4_K", 144, 16
	if five {
		nm, bytes, qs = "Q5_K", 176, 48
	}
	name := "qrow" + nm + k.isaName()
	TEXT(name, NOSPLIT, k.sig())
	Doc(fmt.Sprintf("%s computes up to 8 %s weight rows times one activation row (see asmgen's rowquant.go).", name, nm))
	c0f := k.splatY(0x0f0f0f0f)
	var c10 VecVirtual
	if five {
		c10 = k.splatY(0x10101010)
	}
	// (sc_j, sc_j) word pairs from the 8 scale bytes in both halves.
	var scb []byte
	for h := range 2 {
		for j := range 4 {
			scb = append(scb, byte(4*h+j), 0x80, byte(4*h+j), 0x80)
		}
	}
	scShuf := table("q4kscpairs", scb)
	// d|dmin dwords to d₀..d₃, dmin₀..dmin₃ words.
	dShuf := table("q4kdsplit", []byte{0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15})
	negHi := table("negmhalf", []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
		0, 0, 0, 0x80, 0, 0, 0, 0x80, 0, 0, 0, 0x80, 0, 0, 0, 0x80})
	stash := AllocLocal(4 * 32)
	k.phase1(256, bytes, func(wq, xq, b, slot GPVirtual) {
		mq := GP64()
		MOVQ(b, mq)
		SHLQ(U8(6), mq)
		ADDQ(paramMem("meta"), mq)
		// First the scales and mins of the 4 super-blocks (the scale
		// pairs to the stack, well before the dot products load them).
		var mx [4]VecVirtual
		for t := range 4 {
			blk := func(d int) Mem { return Mem{Base: wq, Disp: bytes*t + d} }
			sc, mn := unpackScalesK4(blk)
			sv := YMM()
			if avx512 {
				VPBROADCASTQ(sc, sv)
			} else {
				x := XMM()
				VMOVQ(sc, x)
				VPBROADCASTQ(x, sv)
			}
			VPSHUFB(scShuf, sv, sv)
			VMOVDQU(sv, stash.Offset(32*t))
			mx[t] = XMM()
			VMOVQ(mn, mx[t])
			VPMOVZXBW(mx[t], mx[t])
			VPMADDWD(Mem{Base: mq, Disp: 64*t + metaSums32}, mx[t], mx[t])
		}
		z := make([]VecVirtual, 4)
		for t := range 4 {
			blk := func(d int) Mem { return Mem{Base: wq, Disp: bytes*t + d} }
			var qh VecVirtual
			if five {
				qh = YMM()
				VMOVDQU(blk(16), qh)
			}
			// Two chains of sums, each started by its first product
			// (no zeroing, no first add).
			const nacc = 2
			acc := make([]VecVirtual, nacc)
			for c := range 4 {
				m := blk(qs + 32*c)
				lo, hi := YMM(), YMM()
				// (VEX has no VPSRLW from memory: one load, two ANDs.)
				VMOVDQU(m, hi)
				VPAND(c0f, hi, lo)
				VPSRLW(U8(4), hi, hi)
				VPAND(c0f, hi, hi)
				for h, v := range []VecVirtual{lo, hi} {
					if five {
						// Bit 2c (2c+1) of each qh byte to bit 4.
						f := YMM()
						switch n := 4 - 2*c - h; {
						case n > 0:
							VPSLLW(U8(n), qh, f)
						case n < 0:
							VPSRLW(U8(-n), qh, f)
						default:
							VMOVDQU(qh, f)
						}
						k.and(c10, f, f)
						if avx512 {
							VPORD(f, v, v)
						} else {
							VPOR(f, v, v)
						}
					}
					p := YMM()
					VPMADDUBSW(Mem{Base: xq, Disp: 256*t + 64*c + 32*h}, v, p)
					if j := 2*c + h; j < nacc {
						s := YMM()
						VPBROADCASTD(stash.Offset(32*t+4*j), s)
						acc[j] = YMM()
						VPMADDWD(s, p, acc[j])
					} else {
						k.pairDot(stash.Offset(32*t+4*j), true, p, acc[j%nacc])
					}
				}
			}
			for i := 1; i < nacc; i++ {
				VPADDD(acc[i], acc[0], acc[0])
			}
			ix := k.extractHi(acc[0])
			VPADDD(acc[0].AsX(), ix, ix)
			z[t] = k.insertHi(ix, mx[t])
		}
		c := k.tree4x2(z)
		f := YMM()
		VCVTDQ2PS(c, f)
		VXORPS(negHi, f, f)
		VMOVUPS(f, Mem{Base: slot})
		q0 := pack2x32(wq, 0, bytes)
		q1 := pack2x32(wq, 2*bytes, bytes)
		x := XMM()
		VMOVQ(q0, x)
		VPINSRQ(U8(1), q1, x, x)
		VPSHUFB(dShuf, x, x)
		ds := YMM()
		VCVTPH2PS(x, ds)
		dy := YMM()
		aux := k.param("aux")
		if avx512 {
			VBROADCASTF32X4(Mem{Base: aux, Index: b, Scale: 4}, dy)
		} else {
			VBROADCASTF128(Mem{Base: aux, Index: b, Scale: 4}, dy)
		}
		VMULPS(dy, ds, ds)
		VMOVUPS(ds, Mem{Base: slot, Disp: 32})
	})
	k.phase2()
	VZEROUPPER()
	RET()
}

// unpackScalesK4 unpacks the 6-bit scales and mins of the Q4_K/Q5_K
// super-block whose bytes blk addresses (ggml's way, in GP registers):
// byte j of sc is scale j, of mn min j.
func unpackScalesK4(blk func(int) Mem) (sc, mn GPVirtual) {
	u0, u1, u2, t1, t2 := GP64(), GP64(), GP64(), GP64(), GP64()
	MOVL(blk(4), u0.As32())
	MOVL(blk(8), u1.As32())
	MOVL(blk(12), u2.As32())
	// Scales 4..7: low 4 bits from bytes 8..11, high 2 from the tops of
	// bytes 0..3; mins 4..7 likewise from the high nibbles and bytes 4..7.
	MOVL(u0.As32(), t1.As32())
	SHRL(U8(6), t1.As32())
	ANDL(U32(0x03030303), t1.As32())
	SHLL(U8(4), t1.As32())
	MOVL(u2.As32(), t2.As32())
	ANDL(U32(0x0f0f0f0f), t2.As32())
	ORL(t1.As32(), t2.As32())
	ANDL(U32(0x3f3f3f3f), u0.As32())
	SHLQ(U8(32), t2)
	ORQ(t2, u0)
	MOVL(u1.As32(), t1.As32())
	SHRL(U8(6), t1.As32())
	ANDL(U32(0x03030303), t1.As32())
	SHLL(U8(4), t1.As32())
	SHRL(U8(4), u2.As32())
	ANDL(U32(0x0f0f0f0f), u2.As32())
	ORL(t1.As32(), u2.As32())
	ANDL(U32(0x3f3f3f3f), u1.As32())
	SHLQ(U8(32), u2)
	ORQ(u2, u1)
	return u0, u1
}

// rowQ6K emits the Q6_K row kernel. The levels (4 low bits from ql, 2
// high from qh, unsigned 0..63) times the activations by VPMADDUBSW;
// per 32 levels (two sub-blocks of 16, one per 128-bit half) times the
// two sub-block scales by VPDPWSSD (VPMADDWD and VPADDD on AVX2) with the
// scales spread by VPSHUFB from a vector holding the even scales in its
// low half and the odd ones in its high half; the offset 32 of the levels
// is taken off as 32·Σ scale·(Σx per 16) by VPMADDWD.
func rowQ6K(avx512 bool) {
	k := &rowKern{avx512: avx512, group: 4, pairs: 1}
	k.setStreams(rowStreamsKAVX2)
	const bytes = 210
	name := "qrowQ6_K" + k.isaName()
	TEXT(name, NOSPLIT, k.sig())
	Doc(fmt.Sprintf("%s computes up to 8 Q6_K weight rows times one activation row (see asmgen's rowquant.go).", name))
	c := k.q6kConsts()
	k.phase1(256, bytes, func(wq, xq, b, slot GPVirtual) {
		mq := GP64()
		MOVQ(b, mq)
		SHLQ(U8(6), mq)
		ADDQ(paramMem("meta"), mq)
		z := make([]VecVirtual, 4)
		for t := range 4 {
			blk := func(d int) Mem { return Mem{Base: wq, Disp: bytes*t + d} }
			xm := func(d int) Mem { return Mem{Base: xq, Disp: 256*t + d} }
			z[t] = k.q6kSuper(c, blk, xm, Mem{Base: mq, Disp: 64*t + metaSums16})
		}
		r := k.tree4x2(z)
		ix := k.extractHi(r)
		VPADDD(r.AsX(), ix, ix)
		f := XMM()
		VCVTDQ2PS(ix, f)
		VMOVUPS(f, Mem{Base: slot})
		q := pack4x16(wq, 208, bytes)
		x := XMM()
		VMOVQ(q, x)
		VCVTPH2PS(x, x)
		VMULPS(Mem{Base: k.param("aux"), Index: b, Scale: 4}, x, x)
		VMOVUPS(x, Mem{Base: slot, Disp: 16})
	})
	k.phase2()
	VZEROUPPER()
	RET()
}

// q6kConst holds the constants of the Q6_K row kernels' super-block.
type q6kConst struct {
	// c0f and c30: the masks, in registers or memory.
	c0f, c30        Op
	evenOdd, scCtrl Mem
}

// q6kConsts emits the constants of q6kSuper.
func (k rowKern) q6kConsts() q6kConst {
	var c q6kConst
	c.c0f = k.splatY(0x0f0f0f0f)
	c.c30 = k.splatY(0x30303030)
	c.evenOdd, c.scCtrl = k.q6kTables()
	return c
}

// q6kTables returns the byte tables of q6kSuper: the even then the odd
// bytes of 16, and the spread of the 16 scales over the quarters.
func (k rowKern) q6kTables() (evenOdd, scCtrl Mem) {
	var eo []byte
	for i := range 8 {
		eo = append(eo, byte(2*i))
	}
	for i := range 8 {
		eo = append(eo, byte(2*i+1))
	}
	var ctrl []byte
	for w := range 8 {
		for range 2 {
			for range 8 {
				ctrl = append(ctrl, byte(2*w), byte(2*w+1))
			}
		}
	}
	return table("q6evenodd", eo), table("q6scspread", ctrl)
}

// q6kSuper emits one Q6_K super-block's dot product with the activations
// (blk: the block's bytes, xm: its 256 activation levels, sums16: their
// sums per 16 in the metadata) as 8 dword partial sums: their total is
// the exact integer Σ scale·(Σ level·x) − 32·Σ scale·(Σx per 16).
func (k rowKern) q6kSuper(c q6kConst, blk, xm func(int) Mem, sums16 Mem) VecVirtual {
	sx := XMM()
	VMOVDQU(blk(192), sx)
	// The offset: 32·Σ scale·(Σx per 16).
	sn := YMM()
	VPMOVSXBW(sx, sn)
	off := YMM()
	VPMADDWD(sums16, sn, off)
	VPSHUFB(c.evenOdd, sx, sx)
	d := YMM()
	VPMOVSXBW(sx, d)
	// Two chains of sums, each started by its first product.
	var acc [2]VecVirtual
	for h := range 2 {
		ql := [2]VecVirtual{YMM(), YMM()}
		VMOVDQU(blk(64*h), ql[0])
		VMOVDQU(blk(64*h+32), ql[1])
		qh := YMM()
		VMOVDQU(blk(128+32*h), qh)
		for q := range 4 {
			// Quarter q: low nibbles of ql[q%2] (q < 2) or high
			// ones, bits 2q, 2q+1 of qh at 4, 5.
			hb := YMM()
			switch n := 4 - 2*q; {
			case n > 0:
				VPSLLW(U8(n), qh, hb)
				k.and(c.c30, hb, hb)
			case n < 0:
				VPSRLW(U8(-n), qh, hb)
				k.and(c.c30, hb, hb)
			default:
				k.and(c.c30, qh, hb)
			}
			lv := YMM()
			if q < 2 {
				k.and(c.c0f, ql[q], lv)
			} else {
				VPSRLW(U8(4), ql[q-2], lv)
				k.and(c.c0f, lv, lv)
			}
			if k.avx512 {
				VPORD(hb, lv, lv)
			} else {
				VPOR(hb, lv, lv)
			}
			p := YMM()
			VPMADDUBSW(xm(128*h+32*q), lv, p)
			sq := YMM()
			VPSHUFB(c.scCtrl.Offset(32*(4*h+q)), d, sq)
			if h == 0 && q < 2 {
				acc[q] = YMM()
				VPMADDWD(sq, p, acc[q])
			} else {
				k.pairDot(sq, false, p, acc[q%2])
			}
		}
	}
	VPADDD(acc[1], acc[0], acc[0])
	VPSLLD(U8(5), off, off)
	VPSUBD(off, acc[0], acc[0])
	return acc[0]
}

// zmmZero returns a zeroed ZMM.
func zmmZero() VecVirtual {
	v := ZMM()
	VXORPS(v, v, v)
	return v
}

// wordIndex emits (once per name) a table of 32 word indices and loads it
// into a ZMM.
func wordIndex(name string, idx [32]int) VecVirtual {
	var b []byte
	for _, i := range idx {
		b = append(b, byte(i), 0)
	}
	z := ZMM()
	VMOVDQU64(table(name, b), z)
	return z
}

// foldZ returns an XMM holding the sums of the four 128-bit quarters of
// the dword lanes of z.
func foldZ(z VecVirtual) VecVirtual {
	y := YMM()
	VEXTRACTI64X4(U8(1), z, y)
	VPADDD(z.AsY(), y, y)
	x := XMM()
	VEXTRACTI32X4(U8(1), y, x)
	VPADDD(y.AsX(), x, x)
	return x
}

// q4kPerm is the order of the 32-byte activation chunks (sub-blocks of
// 32) the AVX-512 Q4_K/Q5_K row kernel wants per super-block: a ZMM of
// low nibbles of qs[64i:64i+64] holds sub-blocks 4i and 4i+2, of high
// ones 4i+1 and 4i+3.
var q4kPerm = [8]int{0, 2, 1, 3, 4, 6, 5, 7}

// rowQ4K512 emits the AVX-512 Q4_K (Q5_K with five) row kernel. Unlike
// rowQ4K, it takes the integer dot product of every 32-weight sub-block
// first, unscaled, and applies the 6-bit scales after: per super-block
// four VPDPBUSDs (levels times activations, two sub-blocks per vector,
// the activations in q4kPerm order, 4 products per dword lane) reduced
// by one tree to its 8 sub-block sums; those of two super-blocks times
// their scales by one VPMULLD. Then one tree for the 4 super-blocks of a
// group reduces I (the scaled sums) and M (the mins times the
// activation sums per 32, one VPMADDWD per two super-blocks): lane
// q4kLane(p, t) of its result holds pair p (I or M) of super-block t,
// and the scale products are stored in the same lanes for phase 2.
//
// The dot products thus depend on nothing but loads. The kernel with the
// scales spread by VPERMW and applied by VPDPWSSD (one instruction more
// per 64 weights) ran no faster for fewer instructions: on the Zen 5 its
// groups waited on the chain from the scale unpacking through the
// VPERMWs, and the next groups' work could not enter the scheduler.
func rowQ4K512(five bool) {
	k := &rowKern{avx512: true, group: 4, pairs: 2}
	k.pos = q4kLane
	nm, bytes, qs := "Q4_K", 144, 16
	if five {
		nm, bytes, qs = "Q5_K", 176, 48
	}
	name := "qrow" + nm + "AVX512"
	TEXT(name, NOSPLIT, k.sig())
	Doc(fmt.Sprintf("%s computes up to 8 %s weight rows times one activation row (activation sub-blocks in q4kPerm order; see asmgen's rowquant.go).", name, nm))
	c0f := splat(0x0f0f0f0f)
	ones := splat(0x00010001)
	// The sub-block of lane l of a super-block's 8 sums (the tree's
	// order): lanes 0..3 the first sub-blocks of vectors 0..3, 4..7 the
	// second ones.
	sub := func(l int) int { return q4kPerm[2*(l%4)+l/4] }
	// Scale j of super-block 2i+s is word 16s + j%4 + 8(j/4) of the
	// unpacked words of super-blocks 2i, 2i+1 (see below); scIdx puts it
	// in the low word of dword lane 8s + l for the sum of lane l.
	var w [32]int
	for L := range 16 {
		j := sub(L % 8)
		w[2*L] = 16*(L/8) + j%4 + 8*(j/4)
	}
	scIdx := wordIndex("q4kscdw", w)
	evenWords := K()
	{
		g := GP32()
		MOVL(U32(0x55555555), g)
		KMOVD(g, evenWords)
	}
	// dy_t to the lanes of super-block t: lane l holds t = 2(l%2) + l/4.
	var dyi []byte
	for l := range 8 {
		dyi = append(dyi, byte(2*(l%2)+l/4), 0, 0, 0)
	}
	dyIdx := YMM()
	VMOVDQU64(table("q4kdyidx", dyi), dyIdx)
	var c10, rot [2]VecVirtual
	if five {
		c10[0] = splat(0x10101010)
		// The fifth bit of sub-block j is bit j of qh: rotate it to
		// bit 4 of its byte, for the two sub-blocks of each vector.
		for h := range 2 {
			var rb []byte
			for _, j := range [2]int{q4kPerm[2*h], q4kPerm[2*h+1]} {
				for range 8 {
					r := (4 - j + 32) % 32
					rb = append(rb, byte(r), 0, 0, 0)
				}
			}
			rot[h] = ZMM()
			VMOVDQU64(table(fmt.Sprintf("q5krot%d", h), rb), rot[h])
		}
	}
	// The group's scales and mins unpack in one vector (quarter t: bytes
	// 4..19 of super-block t): scales 0..3 and mins 0..3 are bytes 0..7
	// & 63; scales 4..7 the low nibbles of bytes 8..11 with the top bits
	// of bytes 0..3 at bits 4, 5; mins 4..7 the high nibbles with the top
	// bits of bytes 4..7.
	var ma, mh, mt []byte
	for range 4 {
		ma = append(ma, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x0f, 0x0f, 0x0f, 0x0f, 0, 0, 0, 0)
		mh = append(mh, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x0f, 0x0f, 0x0f, 0x0f)
		mt = append(mt, 0x30, 0x30, 0x30, 0x30, 0x30, 0x30, 0x30, 0x30, 0, 0, 0, 0, 0, 0, 0, 0)
	}
	maskA, maskH, maskT := table("q4kunpacka", ma), table("q4kunpackh", mh), table("q4kunpackt", mt)
	// d_t, dmin_t (words 8t, 8t+1 of the group's first 16 bytes of each
	// super-block, quarter t) to the words in q4kLane order.
	var dw [32]int
	var neg []byte
	for l := range 8 {
		for t := range 4 {
			for p := range 2 {
				if q4kLane(p, t) == l {
					dw[l] = 8*t + p
					s := byte(0)
					if p == 1 {
						s = 0x80 // −M
					}
					neg = append(neg, 0, 0, 0, s)
				}
			}
		}
	}
	dIdx := wordIndex("q4kdidx", dw)
	negM := table("q4knegm", neg)
	k.phase1(256, bytes, func(wq, xq, b, slot GPVirtual) {
		// The unscaled sub-block sums of each super-block: lane l of
		// quarter q of sums[t] is quarter q of vector l's products.
		var sums [4]VecVirtual
		for t := range 4 {
			blk := func(d int) Mem { return Mem{Base: wq, Disp: bytes*t + d} }
			var qh [2]VecVirtual
			if five {
				q := ZMM()
				VBROADCASTI64X4(blk(16), q)
				for h := range 2 {
					qh[h] = ZMM()
					VPROLVD(rot[h], q, qh[h])
				}
			}
			d := make([]VecVirtual, 4)
			for i := range 2 {
				// One load (most cross a cache line: 144-byte blocks).
				m := ZMM()
				VMOVDQU64(blk(qs+64*i), m)
				lo, hi := ZMM(), ZMM()
				VPANDD(m, c0f, lo)
				VPSRLW(U8(4), m, hi)
				VPANDD(c0f, hi, hi)
				for h, v := range []VecVirtual{lo, hi} {
					if five {
						// qh bits of this vector's sub-blocks: the
						// rotation of its pair (lo: 4i, 4i+2; hi:
						// 4i+1, 4i+3) shifted by 4i.
						f := qh[h]
						if i == 1 {
							f = ZMM()
							VPROLD(U8(28), qh[h], f)
						}
						VPTERNLOGD(U8(0xF8), c10[0], f, v)
					}
					d[2*i+h] = zmmZero()
					vpdpbusd(Mem{Base: xq, Disp: 256*t + 128*i + 64*h}, v, d[2*i+h], false)
				}
			}
			sums[t] = packTree4(d, ones)
		}
		// Quarter t: d, dmin and the 12 scale bytes of super-block t.
		raw := ZMM()
		VMOVDQU32(Mem{Base: wq}, raw.AsX())
		for t := 1; t < 4; t++ {
			VINSERTI32X4(U8(t), Mem{Base: wq, Disp: bytes * t}, raw, raw)
		}
		v := ZMM()
		VPSRLDQ(U8(4), raw, v)
		u, h, tp := ZMM(), ZMM(), ZMM()
		VPANDD(maskA, v, u)
		VPSLLDQ(U8(4), v, h)
		VPSRLW(U8(4), h, h)
		VPSRLW(U8(2), v, tp)
		VPANDD(maskT, tp, tp)
		VPSLLDQ(U8(8), tp, tp)
		VPTERNLOGD(U8(0xF8), maskH, h, tp) // tp | (h & maskH)
		VPORD(tp, u, u)
		// Words of super-blocks 0, 1 and 2, 3.
		sw := [2]VecVirtual{ZMM(), ZMM()}
		VPMOVZXBW(u.AsY(), sw[0])
		uh := YMM()
		VEXTRACTI64X4(U8(1), u, uh)
		VPMOVZXBW(uh, sw[1])
		// M's partial sums: the words times the activation sums per 32
		// (32 bytes per super-block after the nb scales in aux).
		bs := k.param("aux")
		LEAQ(Mem{Base: bs, Index: k.nb, Scale: 4}, bs)
		o := GP64()
		MOVQ(b, o)
		SHLQ(U8(5), o)
		ADDQ(o, bs)
		// Per pair of super-blocks: quarters 0+1 of sums (the first
		// sub-blocks of the 4 vectors) and 2+3 (the second ones) side by
		// side, times the scales.
		var z [4]VecVirtual
		for i := range 2 {
			x, y := ZMM(), ZMM()
			VSHUFI64X2(U8(0b10_00_10_00), sums[2*i+1], sums[2*i], x)
			VSHUFI64X2(U8(0b11_01_11_01), sums[2*i+1], sums[2*i], y)
			VPADDD(y, x, x)
			sc := ZMM()
			VPERMW_Z(sw[i], scIdx, evenWords, sc)
			VPMULLD(sc, x, x)
			z[i] = x
			z[2+i] = ZMM()
			VPMADDWD(Mem{Base: bs, Disp: 64 * i}, sw[i], z[2+i])
		}
		// Quarter q of r, lane j: the sum of quarter q of z[j]; the sums
		// of quarters 0+1 (super-blocks 0, 2) and 2+3 (1, 3).
		r := tree4(z[:], ZMM)
		g := ZMM()
		VSHUFI64X2(U8(0b11_01_10_00), r, r, g)
		c := YMM()
		VEXTRACTI64X4(U8(1), g, c)
		VPADDD(g.AsY(), c, c)
		f := YMM()
		VCVTDQ2PS(c, f)
		VMOVUPS(f, Mem{Base: slot})
		x := ZMM()
		VPERMW(raw, dIdx, x)
		dd := YMM()
		VCVTPH2PS(x.AsX(), dd)
		dy := YMM()
		VPERMPS(Mem{Base: k.param("aux"), Index: b, Scale: 4}, dyIdx, dy)
		VMULPS(dy, dd, dd)
		// fma(M, −dmin·dy, acc) is fma(−M, dmin·dy, acc) exactly; the
		// sign goes on this side, off the integers' longer chain.
		VXORPS(negM, dd, dd)
		VMOVUPS(dd, Mem{Base: slot, Disp: 32})
	})
	k.phase2()
	VZEROUPPER()
	RET()
}

// packTree4 is tree4 for 4 ZMMs of dword lanes whose sums of pairs fit in
// int16 (VPDPBUSD sums of 4 products of levels 0..31 and int8
// activations: at most 4·31·128 = 15872): each level packs two vectors to
// words (VPACKSSDW, exact here) and adds the pairs by VPMADDWD by ones,
// half the shuffles of tree4's unpacks (the Zen 5's shuffle pipes are
// this kernel's busiest).
func packTree4(p []VecVirtual, ones VecVirtual) VecVirtual {
	var a [2]VecVirtual
	for i := range 2 {
		a[i] = ZMM()
		VPACKSSDW(p[2*i+1], p[2*i], a[i])
		VPMADDWD(ones, a[i], a[i])
	}
	r := ZMM()
	VPACKSSDW(a[1], a[0], r)
	VPMADDWD(ones, r, r)
	return r
}

// q4kLane is the lane of the AVX-512 Q4_K/Q5_K row kernel's group vectors
// that holds pair p (0: I, 1: M) of super-block t (see rowQ4K512).
func q4kLane(p, t int) int { return 4*(t%2) + 2*p + t/2 }

// rowQ6K512 emits the AVX-512 Q6_K row kernel: that of rowQ6K with 512-bit
// vectors: the 64 low nibbles of ql[64h:64h+64] with their qh bits are the
// levels of sub-blocks 8h..8h+3 (one per 128-bit quarter), the high
// nibbles those of 8h+4..8h+7, in activation order; the scales of a
// vector's four sub-blocks are spread by VPERMW.
func rowQ6K512() {
	k := &rowKern{avx512: true, group: 4, pairs: 1}
	const bytes = 210
	name := "qrowQ6_KAVX512"
	TEXT(name, NOSPLIT, k.sig())
	Doc(fmt.Sprintf("%s computes up to 8 Q6_K weight rows times one activation row (see asmgen's rowquant.go).", name))
	c0f := splat(0x0f0f0f0f)
	c30 := splat(0x30303030)
	var idx [4]VecVirtual
	for i := range idx {
		var w [32]int
		for l := range w {
			w[l] = 4*i + l/8
		}
		idx[i] = wordIndex(fmt.Sprintf("q6scidx%d", i), w)
	}
	// The qh bits of quarter q at bits 4, 5: shift left by 4 − 2q words
	// (q < 2, low nibbles), right by 2q − 4 (q ≥ 2, high nibbles).
	var sh [2]VecVirtual
	for i, v := range [2][2]int{{4, 2}, {0, 2}} {
		var w [32]int
		for l := range w {
			w[l] = v[l/16]
		}
		sh[i] = wordIndex(fmt.Sprintf("q6qhshift%d", i), w)
	}
	k.phase1(256, bytes, func(wq, xq, b, slot GPVirtual) {
		mq := GP64()
		MOVQ(b, mq)
		SHLQ(U8(6), mq)
		ADDQ(paramMem("meta"), mq)
		z := make([]VecVirtual, 4)
		for t := range 4 {
			blk := func(d int) Mem { return Mem{Base: wq, Disp: bytes*t + d} }
			sw := YMM()
			VPMOVSXBW(blk(192), sw)
			off := YMM()
			VPMADDWD(Mem{Base: mq, Disp: 64*t + metaSums16}, sw, off)
			acc := [2]VecVirtual{zmmZero(), zmmZero()}
			for h := range 2 {
				q := ZMM()
				VBROADCASTI64X4(blk(128+32*h), q)
				hb := [2]VecVirtual{ZMM(), ZMM()}
				VPSLLVW(sh[0], q, hb[0])
				VPSRLVW(sh[1], q, hb[1])
				// One load (most cross a cache line: 210-byte blocks).
				ql, qs := ZMM(), ZMM()
				VMOVDQU64(blk(64*h), ql)
				VPSRLW(U8(4), ql, qs)
				for i := range 2 {
					VPANDD(c30, hb[i], hb[i])
					// hb | (levels & 0x0f)
					if i == 0 {
						VPTERNLOGD(U8(0xF8), ql, c0f, hb[i])
					} else {
						VPTERNLOGD(U8(0xF8), c0f, qs, hb[i])
					}
					p := ZMM()
					VPMADDUBSW(Mem{Base: xq, Disp: 256*t + 128*h + 64*i}, hb[i], p)
					s := ZMM()
					VPERMW(sw.AsZ(), idx[2*h+i], s)
					vpdpwssd(s, p, acc[i], false)
				}
			}
			VPADDD(acc[1], acc[0], acc[0])
			// off's upper half is zero (a 256-bit result).
			VPSLLD(U8(5), off, off)
			VPSUBD(off.AsZ(), acc[0], acc[0])
			z[t] = acc[0]
		}
		ix := foldZ(tree4(z, ZMM))
		f := XMM()
		VCVTDQ2PS(ix, f)
		VMOVUPS(f, Mem{Base: slot})
		q := pack4x16(wq, 208, bytes)
		x := XMM()
		VMOVQ(q, x)
		VCVTPH2PS(x, x)
		VMULPS(Mem{Base: k.param("aux"), Index: b, Scale: 4}, x, x)
		VMOVUPS(x, Mem{Base: slot, Disp: 16})
	})
	k.phase2()
	VZEROUPPER()
	RET()
}
