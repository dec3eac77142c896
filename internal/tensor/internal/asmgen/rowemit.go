package main

// The small emitters the row kernels share (their design is in
// rowquant.go): the ISA-dependent moves, broadcasts and half extracts, the
// reduction trees across lanes, the read-only byte tables, and loads that
// pack strided scalars into one GP register.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// paramMem returns the stack address of the parameter name.
func paramMem(name string) Mem {
	b, err := Param(name).Resolve()
	if err != nil {
		panic(err)
	}
	return b.Addr
}

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
