package tensor

import (
	"fmt"
	"sync"
	"unsafe"
)

const (
	// serialFMAs is the size (m·n·k) below which MatMul runs on the caller
	// alone: waking a worker costs more than it saves.
	serialFMAs = 1 << 15
	// chunksPerThread is how many pieces of work MatMul makes per thread so
	// that dynamic claiming evens out noisy neighbours.
	chunksPerThread = 4
	// panelChunksPerThread replaces chunksPerThread when m is larger than
	// one tile and the weights are walked in prefetched panels.
	panelChunksPerThread = 2
	// rowChunksPerThread replaces chunksPerThread for one activation row
	// (single-stream decode): the M = 1 kernels read several weight rows
	// side by side from as many regions of their range, each region one
	// sequential stream the L2's prefetchers follow, and every range
	// starts its streams cold. A small model's matrices (576 rows of 612
	// bytes in SmolLM2-135M's Q8_0) cut in 4 ranges per thread left
	// streams of 5–10 KiB; in 2, twice as long, with dynamic claiming
	// kept for a descheduled thread.
	rowChunksPerThread = 2
	// chunkAlign is the granularity (in weight rows) of MatMul's work
	// split, a multiple of every kernel set's cols.
	chunkAlign = 16
	// panelBytes bounds the weights one pass of x-row groups walks over
	// when m is larger than one tile (at least one kernel pass of rows),
	// for the bf16-activation kernels: small enough to stay in L1 while
	// every group of x rows reads them, with the next panel prefetched
	// meanwhile. 9 KiB is 8 rows of a 576-wide bf16 matrix; it measured
	// faster than 64, 18 and 14 KiB (model DecodeBatch16 and Prefill, see
	// docs/performance-log.md).
	panelBytes = 9 << 10
	// panelBytesF32 is panelBytes for the f32-activation kernels, whose x
	// rows take twice the cache: 64 KiB (in L2) measured 3–13% faster
	// than 9 KiB for them.
	panelBytesF32 = 64 << 10
)

// MatMul computes out[i*w.Rows+j] = Σ_k x[i*w.Cols+k]·W[j][k] for i < m and
// j < w.Rows: the product of the m×Cols activations x with the transposed
// weights, as a Hugging Face Linear layer does. Weights stay in their dtype
// and are widened to f32 inside the kernels; accumulation is in f32. With
// the avx512bf16 ISA and bf16 weights, the activations are first rounded to
// bf16 (nearest even) and multiplied with VDPBF16PS, as llama.cpp does for
// bf16 weights: twice the arithmetic per instruction for a relative input
// error of at most 2⁻⁹ per activation.
//
// Every output element is computed with the same reduction order whatever m
// is, whichever worker or kernel tile computes it (batch invariance), for a
// given ISA. out must not overlap x. MatMul panics if x, out or w are
// shorter than the shapes require (a programming error, like an index out
// of range).
func (p *Pool) MatMul(out, x []float32, m int, w *Mat) { p.matMul(active.Load(), out, x, m, w) }

// matMul is MatMul with the kernel set ks (calibration times candidate
// sets with it without making them active).
func (p *Pool) matMul(ks *kernelSet, out, x []float32, m int, w *Mat) {
	n, k := w.Rows, w.Cols
	checkMatMul(out, x, m, w)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		clear(out[:m*n])
		return
	}
	if w.DType.Quantized() {
		p.matmulQuant(ks, out, x, m, w)
		return
	}
	chunk := n
	if p.threads > 1 && m*n*k >= serialFMAs {
		per := chunksPerThread
		if m == 1 {
			per = rowChunksPerThread
		}
		if m > maxTileRows {
			// Fewer, longer ranges: each range's first panel of weights
			// is read cold, the later ones are prefetched.
			per = panelChunksPerThread
		}
		chunk = (n + p.threads*per - 1) / (p.threads * per)
		chunk = (chunk + chunkAlign - 1) / chunkAlign * chunkAlign
	}
	var xb []uint16
	if w.DType == BF16 && ks.toBF16 != nil {
		buf := bf16Scratch.Get().(*[]uint16)
		defer bf16Scratch.Put(buf)
		if cap(*buf) < m*k {
			*buf = make([]uint16, m*k)
		}
		xb = (*buf)[:m*k]
		ks.toBF16(&x[0], &xb[0], m*k)
		if ks.amxBF16 && amxBF16Fits(w) {
			p.matmulAMXBF16(out, xb, m, w, chunk)
			return
		}
	}
	p.run(n, chunk, func(_, lo, hi int) { matmulRange(ks, out, x, xb, m, w, lo, hi) })
}

// BF16Activations reports whether MatMul, with the active ISA, rounds the
// activations to bf16 when the weights are bf16.
func BF16Activations() bool { return active.Load().toBF16 != nil }

// bf16Scratch holds the buffers MatMul rounds activations into for the
// kernel sets that multiply bf16 by bf16.
var bf16Scratch = sync.Pool{New: func() any { return new([]uint16) }}

// checkMatMul panics with a descriptive message if the slices cannot hold
// the shapes MatMul was asked to compute.
func checkMatMul(out, x []float32, m int, w *Mat) {
	n, k := w.Rows, w.Cols
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("tensor: MatMul with negative shape m=%d rows=%d cols=%d", m, n, k))
	}
	if len(x) < m*k {
		panic(fmt.Sprintf("tensor: MatMul x has %d elements, want m×cols = %d×%d", len(x), m, k))
	}
	if len(out) < m*n {
		panic(fmt.Sprintf("tensor: MatMul out has %d elements, want m×rows = %d×%d", len(out), m, n))
	}
	var have int
	switch w.DType {
	case F32:
		have = len(w.F32)
	case BF16, F16:
		have = len(w.U16)
	case Q8_0, Q4_0, Q4_K, Q6_K, Q5_K, Q5_0:
		checkQuant(w)
		return
	default:
		panic(fmt.Sprintf("tensor: MatMul weights have unknown dtype %d", w.DType))
	}
	if have < n*k {
		panic(fmt.Sprintf("tensor: MatMul %s weights have %d elements, want rows×cols = %d×%d", w.DType, have, n, k))
	}
}

// matmulRange computes output columns [lo,hi) (weight rows) for all m rows
// of x (of xb, x rounded to bf16, when the kernel set multiplies bf16 by
// bf16 and the weights are bf16). For m above one tile it walks the weights
// in panels small enough to stay in cache while every group of x rows
// passes over them, a group of 3 or 4 x rows over blocks of K where K is
// above the kernel set's kBlockMin (matmulBlocked).
func matmulRange(ks *kernelSet, out, x []float32, xb []uint16, m int, w *Mat, lo, hi int) {
	n, k := w.Rows, w.Cols
	esize := 4
	if w.DType != F32 {
		esize = 2
	}
	panel := hi - lo
	if m > maxTileRows {
		pb := panelBytes
		if xb == nil {
			pb = panelBytesF32
		}
		if w.DType == F32 && ks.panelF32 > 0 {
			pb = ks.panelF32
		}
		panel = max(ks.cols, pb/(k*esize)/ks.cols*ks.cols)
	}
	var wbase uintptr // only an address to prefetch, never dereferenced
	if w.DType == F32 {
		wbase = uintptr(unsafe.Pointer(&w.F32[0]))
	} else {
		wbase = uintptr(unsafe.Pointer(&w.U16[0]))
	}
	for plo := lo; plo < hi; plo += panel {
		rows := min(panel, hi-plo)
		// The multi-row kernels prefetch one line per K step, about rows·k
		// bytes per tile: tile i warms part i of the next panel of this
		// range while the current one, already in cache, is computed on.
		// Tiles with nothing left to warm re-touch the current panel.
		cur := wbase + uintptr(plo*k*esize)
		next, nextEnd := cur+uintptr(rows*k*esize), cur
		if plo+panel < hi {
			nextEnd = next + uintptr(min(panel, hi-plo-panel)*k*esize)
		}
		for i := 0; i < m; i += maxTileRows {
			r := min(maxTileRows, m-i)
			if xb == nil && r >= 3 && ks.kBlockMin > 0 && k > ks.kBlockMin {
				matmulBlocked(ks, out[i*n+plo:], x[i*k:], r, w, plo, rows)
				continue
			}
			pf := next + uintptr(i/maxTileRows*rows*k)
			if pf >= nextEnd {
				pf = cur
			}
			op := &out[i*n+plo]
			if xb != nil {
				ks.bf16x[r-1](&xb[i*k], k, &w.U16[plo*k], k, k, rows, op, n, pf)
				continue
			}
			xp := &x[i*k]
			switch w.DType {
			case F32:
				ks.f32[r-1](xp, k, &w.F32[plo*k], k, k, rows, op, n, pf)
			case BF16:
				ks.bf16[r-1](xp, k, &w.U16[plo*k], k, k, rows, op, n, pf)
			case F16:
				ks.f16[r-1](xp, k, &w.U16[plo*k], k, k, rows, op, n, pf)
			}
		}
	}
}

// kBlock is the number of K elements one call of a blocked kernel covers
// (a multiple of 8): 4 f32 x rows of it take 8 KiB of L1, the 3 weight
// rows of a tile 6 KiB (f32) or 3 KiB (bf16).
const kBlock = 512

// accScratch holds the accumulators of matmulBlocked between K blocks.
var accScratch = sync.Pool{New: func() any { return new([]float32) }}

// matmulBlocked computes the r (3 or 4) x rows at x (row stride w.Cols)
// times weight rows [lo,lo+rows) into out (row stride w.Rows), with the
// kernels over blocks of K (kernelSet.f32KB, u16KB) in order: the x rows
// of a block stay in L1 while a tile's weight rows stream past them, where
// whole rows of K above kBlockMin would not fit. Each output gets the same
// FMAs in the same order as from the whole-K kernels.
func matmulBlocked(ks *kernelSet, out, x []float32, r int, w *Mat, lo, rows int) {
	n, k := w.Rows, w.Cols
	buf := accScratch.Get().(*[]float32)
	defer accScratch.Put(buf)
	if cap(*buf) < rows*r*8 {
		*buf = make([]float32, rows*r*8)
	}
	acc := &(*buf)[0]
	kv := k &^ 7
	nb := (kv + kBlock - 1) / kBlock
	step := (kv/nb + 7) &^ 7
	for k0 := 0; k0 < kv; k0 += step {
		k1 := min(k0+step, kv)
		switch w.DType {
		case F32:
			ks.f32KB[r-3](&x[0], k, &w.F32[lo*k], k, k0, k1, k, rows, &out[0], n, acc)
		case BF16:
			ks.u16KB[0][r-3](&x[0], k, &w.U16[lo*k], k, k0, k1, k, rows, &out[0], n, acc)
		case F16:
			ks.u16KB[1][r-3](&x[0], k, &w.U16[lo*k], k, k0, k1, k, rows, &out[0], n, acc)
		}
	}
}
