package main

// The f32 vector kernels: dot and axpy of each instruction set, and the
// AVX-512 row-accumulating axpyRows (f32 or bf16 value rows: attention's
// weighted value sum) on the block loop of axpyloop.go (vectorBlocks).

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// dot emits Dot over n elements with the instruction set's fixed structure.
func dot(s isa) {
	name := "dot" + s.name
	TEXT(name, NOSPLIT, "func(a, b *float32, n int) float32")
	Doc(name + " returns Σ a[t]·b[t] for t < n.")
	a := Load(Param("a"), GP64())
	b := Load(Param("b"), GP64())
	n := Load(Param("n"), GP64())
	nv := GP64()
	MOVQ(n, nv)
	ANDQ(I32(-s.lanes), nv)
	acc := s.vec()
	VXORPS(acc, acc, acc)
	idx = GP64()
	XORQ(idx, idx)
	TESTQ(nv, nv)
	JE(LabelRef("tail"))
	Label("loop")
	v := s.vec()
	VMOVUPS(Mem{Base: a, Index: idx, Scale: 4}, v)
	VFMADD231PS(Mem{Base: b, Index: idx, Scale: 4}, v, acc)
	ADDQ(U32(s.lanes), idx)
	CMPQ(idx, nv)
	JL(LabelRef("loop"))
	Label("tail")
	if s.lanes == 16 {
		mask := tailMask(n)
		CMPQ(idx, n)
		JE(LabelRef("reduce"))
		va, vb := s.vec(), s.vec()
		VMOVUPS_Z(Mem{Base: a, Index: idx, Scale: 4}, mask, va)
		VMOVUPS_Z(Mem{Base: b, Index: idx, Scale: 4}, mask, vb)
		VFMADD231PS(vb, va, acc)
		Label("reduce")
		sum := reduce(s, acc)
		Store(sum, ReturnIndex(0))
	} else {
		sum := reduce(s, acc)
		Label("scalar")
		CMPQ(idx, n)
		JE(LabelRef("done"))
		xa := XMM()
		VMOVSS(Mem{Base: a, Index: idx, Scale: 4}, xa)
		VFMADD231SS(Mem{Base: b, Index: idx, Scale: 4}, xa, sum)
		INCQ(idx)
		JMP(LabelRef("scalar"))
		Label("done")
		Store(sum, ReturnIndex(0))
	}
	VZEROUPPER()
	RET()
}

// axpy emits y[t] += alpha·x[t] for t < n, one FMA per element.
func axpy(s isa) {
	name := "axpy" + s.name
	TEXT(name, NOSPLIT, "func(alpha float32, x, y *float32, n int)")
	Doc(name + " computes y[t] = fma(alpha, x[t], y[t]) for t < n.")
	al := s.vec()
	VBROADCASTSS(NewParamAddr("alpha", 0), al)
	x := Load(Param("x"), GP64())
	y := Load(Param("y"), GP64())
	n := Load(Param("n"), GP64())
	nv := GP64()
	MOVQ(n, nv)
	ANDQ(I32(-s.lanes), nv)
	idx = GP64()
	XORQ(idx, idx)
	TESTQ(nv, nv)
	JE(LabelRef("tail"))
	Label("loop")
	v := s.vec()
	VMOVUPS(Mem{Base: y, Index: idx, Scale: 4}, v)
	VFMADD231PS(Mem{Base: x, Index: idx, Scale: 4}, al, v)
	VMOVUPS(v, Mem{Base: y, Index: idx, Scale: 4})
	ADDQ(U32(s.lanes), idx)
	CMPQ(idx, nv)
	JL(LabelRef("loop"))
	Label("tail")
	if s.lanes == 16 {
		mask := tailMask(n)
		CMPQ(idx, n)
		JE(LabelRef("done"))
		vx, vy := s.vec(), s.vec()
		VMOVUPS_Z(Mem{Base: x, Index: idx, Scale: 4}, mask, vx)
		VMOVUPS_Z(Mem{Base: y, Index: idx, Scale: 4}, mask, vy)
		VFMADD231PS(vx, al, vy)
		VMOVUPS(vy, mask, Mem{Base: y, Index: idx, Scale: 4})
	} else {
		Label("scalar")
		CMPQ(idx, n)
		JE(LabelRef("done"))
		vy := XMM()
		VMOVSS(Mem{Base: y, Index: idx, Scale: 4}, vy)
		VFMADD231SS(Mem{Base: x, Index: idx, Scale: 4}, al.AsX(), vy)
		VMOVSS(vy, Mem{Base: y, Index: idx, Scale: 4})
		INCQ(idx)
		JMP(LabelRef("scalar"))
	}
	Label("done")
	VZEROUPPER()
	RET()
}

// axpyRows512 emits y[t] = fma(alpha[r], v[r·ldv+t], y[t]) for r = 0..rows-1
// in order, for t < n: the same per-element operations as rows calls of
// axpy, but with y held in registers across the rows (attention's sum of
// value rows weighted by the probabilities). With dt bf16, v holds bf16
// values, widened exactly to f32 before the FMA.
func axpyRows512(dt dtype) {
	name := "axpyRowsAVX512"
	if dt != dtF32 {
		name = "axpyRows" + dt.name + "AVX512"
	}
	TEXT(name, NOSPLIT, fmt.Sprintf("func(alpha *float32, v %s, ldv int, rows int, y *float32, n int)", dt.goType))
	Doc(name + " computes y[t] = fma(alpha[r], v[r*ldv+t], y[t]) for r < rows in order, t < n.")
	a := Load(Param("alpha"), GP64())
	v := Load(Param("v"), GP64())
	ldv := Load(Param("ldv"), GP64())
	SHLQ(U8(dt.shift), ldv)
	rows := Load(Param("rows"), GP64())
	y := Load(Param("y"), GP64())
	n := Load(Param("n"), GP64())
	left := GP64()
	MOVQ(n, left)
	esz := 1 << dt.shift
	block := func(lbl string, vecs int, mask Op) {
		acc := make([]VecVirtual, vecs)
		for i := range acc {
			acc[i] = ZMM()
			if mask == nil {
				VMOVUPS(Mem{Base: y, Disp: 64 * i}, acc[i])
			} else {
				VMOVUPS_Z(Mem{Base: y}, mask, acc[i])
			}
		}
		valueRows(lbl, v, a, rows, ldv, func(vr, ar GPVirtual) {
			b := ZMM()
			VBROADCASTSS(Mem{Base: ar}, b)
			for i := range acc {
				switch {
				case dt == dtF32 && mask == nil:
					VFMADD231PS(Mem{Base: vr, Disp: 64 * i}, b, acc[i])
				case dt == dtF32:
					t := ZMM()
					VMOVUPS_Z(Mem{Base: vr}, mask, t)
					VFMADD231PS(t, b, acc[i])
				default:
					t := ZMM()
					loadW(avx512, dt, Mem{Base: vr, Disp: 16 * esz * i}, t, mask)
					VFMADD231PS(t, b, acc[i])
				}
			}
		})
		for i := range acc {
			if mask == nil {
				VMOVUPS(acc[i], Mem{Base: y, Disp: 64 * i})
			} else {
				VMOVUPS(acc[i], mask, Mem{Base: y})
			}
		}
		ADDQ(U32(64*vecs), y)
		ADDQ(U32(16*esz*vecs), v)
		SUBQ(U32(16*vecs), left)
	}
	vectorBlocks(left, 16, 4,
		func(lbl string, vecs int) { block(lbl, vecs, nil) },
		func() { block("t", 1, tailMask(left)) })
}
