package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// axpyRowsAVX2 emits attention's weighted sum of bf16 or f32 (dt) value
// rows on AVX2 for g = 1..4 outputs sharing the value rows (the query heads
// of one GQA group): y[h·ldy+t] = fma(alpha[h·lda+r], v[r·ldv+t], y[h·ldy+t])
// for h < g, r < rows in order, t < n, each bf16 value widened exactly to
// f32. Every output element sees the same single-rounding FMAs, in the same
// row order, as rows calls of axpyAVX2 over the (widened) rows (the fallback
// it replaces), so results are bit-identical; y stays in registers across
// the rows and each value vector is loaded (and widened) once for the g
// outputs. The n%8 tail runs one element at a time with scalar FMAs.
//
// g = 1 is axpyRows<dt>AVX2 (bf16: the signature of axpyRowsBF16AVX512;
// f32: that of axpyRowsAVX512); g ≥ 2 is axpyRows<dt>G<g>AVX2 (bf16: the
// signature of axpyRowsBF16G<g>AVX512).
func axpyRowsAVX2(dt dtype, g int) { emitAxpyRowsAVX2(dt, g, false) }

// attnValuesAVX2 emits attnValuesBF16G<g>AVX2 (g = 2..4): decode
// attention's value sums, axpyRowsBF16G<g>AVX2 with a prefetch offset pf
// in bytes as a last argument. Each trip of the wide loop (one value row's
// 8·wide elements: 64 bytes for g ≤ 3, 32 for g = 4) first prefetches the
// next of consecutive addresses from v + pf on (the KV bytes a later call
// will read, handed on by the caller), as many bytes on as the trip reads:
// with n a multiple of 32 the call prefetches rows·n·2 bytes, as many as
// it reads, one PREFETCHT0 beside 4·g FMAs or more (g = 4: each line
// twice). Nothing else differs: the results are axpyRowsBF16G<g>AVX2's bit
// for bit.
func attnValuesAVX2(g int) { emitAxpyRowsAVX2(dtBF16, g, true) }

// emitAxpyRowsAVX2 emits axpyRowsAVX2's kernel, or with pf attnValuesAVX2's.
func emitAxpyRowsAVX2(dt dtype, g int, pf bool) {
	var name string
	var a, lda, v, ldv, rows, y, ldy, n, pd Register
	esize := 1 << dt.shift
	if g == 1 && !pf {
		name = "axpyRows" + dt.name + "AVX2"
		TEXT(name, NOSPLIT, fmt.Sprintf("func(alpha *float32, v %s, ldv int, rows int, y *float32, n int)", dt.goType))
		Doc(name + " computes y[t] = fma(alpha[r], v[r*ldv+t], y[t]) for r < rows in order, t < n.")
		a = Load(Param("alpha"), GP64())
		v = Load(Param("v"), GP64())
		ldv = Load(Param("ldv"), GP64())
		rows = Load(Param("rows"), GP64())
		y = Load(Param("y"), GP64())
		n = Load(Param("n"), GP64())
	} else {
		// The grouped kernel; with pf, the same one named attnValues and
		// with the prefetch offset as a last argument.
		prefix, pfParam, pfDoc := "axpyRows", "", ""
		if pf {
			prefix, pfParam, pfDoc = "attnValues", ", pf int", ", prefetching from v+pf bytes on"
		}
		name = fmt.Sprintf("%s%sG%dAVX2", prefix, dt.name, g)
		TEXT(name, NOSPLIT, fmt.Sprintf("func(alpha *float32, lda int, v %s, ldv int, rows int, y *float32, ldy int, n int%s)", dt.goType, pfParam))
		Doc(fmt.Sprintf("%s computes y[h*ldy+t] = fma(alpha[h*lda+r], v[r*ldv+t], y[h*ldy+t]) for h < %d, r < rows in order, t < n%s.", name, g, pfDoc))
		a = Load(Param("alpha"), GP64())
		lda = Load(Param("lda"), GP64())
		SHLQ(U8(2), lda)
		v = Load(Param("v"), GP64())
		ldv = Load(Param("ldv"), GP64())
		rows = Load(Param("rows"), GP64())
		y = Load(Param("y"), GP64())
		ldy = Load(Param("ldy"), GP64())
		SHLQ(U8(2), ldy)
		n = Load(Param("n"), GP64())
		if pf {
			pd = Load(Param("pf"), GP64())
			ADDQ(v, pd)
		}
	}
	SHLQ(U8(dt.shift), ldv)
	left := GP64()
	MOVQ(n, left)
	// block emits one pass over vecs vectors of 8 outputs per head (or, with
	// scalar, over one element): g·vecs accumulators, g broadcast weights
	// and one widened value vector live at a time (at most 16 registers).
	block := func(lbl string, vecs int, scalar bool) {
		ym := groupRows(y, ldy, g)
		acc := make([][]VecVirtual, g)
		for h := range g {
			acc[h] = make([]VecVirtual, vecs)
			for i := range vecs {
				acc[h][i] = YMM()
				if scalar {
					VMOVSS(ym(h, 0), acc[h][i].AsX())
				} else {
					VMOVUPS(ym(h, 32*i), acc[h][i])
				}
			}
		}
		valueRows(lbl, v, a, rows, ldv, func(vr, ar GPVirtual) {
			b := make([]VecVirtual, g)
			var ah GPVirtual
			if g > 1 {
				ah = GP64()
				MOVQ(ar, ah)
			}
			for h := range g {
				b[h] = YMM()
				if h == 0 {
					VBROADCASTSS(Mem{Base: ar}, b[h])
					continue
				}
				ADDQ(lda, ah)
				VBROADCASTSS(Mem{Base: ah}, b[h])
			}
			if pf && lbl == "w" {
				PREFETCHT0(Mem{Base: pd})
				ADDQ(U8(8*esize*vecs), pd)
			}
			for i := range vecs {
				if scalar {
					val := XMM()
					loadScalarW(dt, Mem{Base: vr}, val)
					for h := range g {
						VFMADD231SS(val, b[h].AsX(), acc[h][i].AsX())
					}
					continue
				}
				val := YMM()
				if dt == dtBF16 {
					// Widened by one byte shuffle (attnWidenTable).
					VBROADCASTI128(Mem{Base: vr, Disp: 8 * esize * i}, val)
					VPSHUFB(attnWidenTable(), val, val)
				} else {
					loadW(avx2, dt, Mem{Base: vr, Disp: 8 * esize * i}, val, nil)
				}
				for h := range g {
					VFMADD231PS(val, b[h], acc[h][i])
				}
			}
		})
		for h := range g {
			for i := range vecs {
				if scalar {
					VMOVSS(acc[h][i].AsX(), ym(h, 0))
				} else {
					VMOVUPS(acc[h][i], ym(h, 32*i))
				}
			}
		}
		step := 8 * vecs
		if scalar {
			step = 1
		}
		ADDQ(U32(4*step), y)
		ADDQ(U32(esize*step), v)
		SUBQ(U32(step), left)
	}
	wide := map[int]int{1: 8, 2: 4, 3: 4, 4: 2}[g]
	vectorBlocks(left, 8, wide,
		func(lbl string, vecs int) { block(lbl, vecs, false) },
		func() {
			block("t", 1, true)
			JMP(LabelRef("ctail"))
		})
}
