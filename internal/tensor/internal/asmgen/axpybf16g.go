package main

// The grouped bf16 axpy of attention's PV product: axpyRowsGroup, g query
// heads of one GQA group sharing each widened value row.

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// axpyRowsGroup emits the grouped form of axpyRowsBF16 for g outputs that
// share the value rows (the query heads of one GQA group):
// y[h·ldy+t] = fma(alpha[h·lda+r], v[r·ldv+t], y[h·ldy+t]) for h < g, r <
// rows in order, t < n. Each output element sees exactly the operations
// axpyRowsBF16 applies to it, so results are bit-identical; every value
// vector is loaded and widened once for the g outputs.
func axpyRowsGroup(g int) {
	name := fmt.Sprintf("axpyRowsBF16G%dAVX512", g)
	TEXT(name, NOSPLIT, "func(alpha *float32, lda int, v *uint16, ldv int, rows int, y *float32, ldy int, n int)")
	Doc(fmt.Sprintf("%s computes y[h*ldy+t] = fma(alpha[h*lda+r], v[r*ldv+t], y[h*ldy+t]) for h < %d, r < rows in order, t < n.", name, g))
	a := Load(Param("alpha"), GP64())
	lda := Load(Param("lda"), GP64())
	SHLQ(U8(2), lda)
	v := Load(Param("v"), GP64())
	ldv := Load(Param("ldv"), GP64())
	SHLQ(U8(1), ldv)
	rows := Load(Param("rows"), GP64())
	y := Load(Param("y"), GP64())
	ldy := Load(Param("ldy"), GP64())
	SHLQ(U8(2), ldy)
	n := Load(Param("n"), GP64())
	left := GP64()
	MOVQ(n, left)
	block := func(lbl string, vecs int, mask Op) {
		ym := groupRows(y, ldy, g)
		acc := make([][]VecVirtual, g)
		for h := range g {
			acc[h] = make([]VecVirtual, vecs)
			for i := range vecs {
				acc[h][i] = ZMM()
				if mask == nil {
					VMOVUPS(ym(h, 64*i), acc[h][i])
				} else {
					VMOVUPS_Z(ym(h, 0), mask, acc[h][i])
				}
			}
		}
		valueRows(lbl, v, a, rows, ldv, func(vr, ar GPVirtual) {
			vals := make([]VecVirtual, vecs)
			for i := range vecs {
				vals[i] = ZMM()
				loadW(avx512, dtBF16, Mem{Base: vr, Disp: 32 * i}, vals[i], mask)
			}
			ah := GP64()
			MOVQ(ar, ah)
			for h := range g {
				b := ZMM()
				VBROADCASTSS(Mem{Base: ah}, b)
				for i := range vecs {
					VFMADD231PS(vals[i], b, acc[h][i])
				}
				if h+1 < g {
					ADDQ(lda, ah)
				}
			}
		})
		for h := range g {
			for i := range vecs {
				if mask == nil {
					VMOVUPS(acc[h][i], ym(h, 64*i))
				} else {
					VMOVUPS(acc[h][i], mask, ym(h, 0))
				}
			}
		}
		ADDQ(U32(64*vecs), y)
		ADDQ(U32(32*vecs), v)
		SUBQ(U32(16*vecs), left)
	}
	wide := 4
	if g > 3 {
		wide = 3 // g·wide accumulators + wide values + a broadcast fit 32 registers
	}
	vectorBlocks(left, 16, wide,
		func(lbl string, vecs int) { block(lbl, vecs, nil) },
		func() { block("t", 1, tailMask(left)) })
}
