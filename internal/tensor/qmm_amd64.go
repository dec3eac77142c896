package tensor

import (
	"sync"
	"unsafe"
)

// The AVX512-VNNI quantized matrix product (see asmgen's quant.go): for
// each group of 16 weight rows, a pack kernel lays a chunk of their blocks
// out as a panel with one row per vector lane, and dot kernels run the
// activation rows over it, a few at a time, continuing 16 f32 chains per
// row (one per weight row) in acc.

type (
	// qpack packs nb blocks of 16 weight rows ldw bytes apart into dst.
	qpack func(w *byte, ldw int, nb int, dst *byte)
	// qdot continues the chains of a fixed number of activation rows
	// (ldx bytes of int8 apart, their metadata ldm bytes apart) over nb
	// blocks of a panel; acc holds 16 f32 per row.
	qdot func(x *int8, ldx int, meta *uint32, ldm int, panel *byte, nb int, acc *float32)
)

// qKernels512 are the pack and dot kernels per quantized dtype.
var qKernels512 = map[DType]struct {
	pack qpack
	dot  []qdot
	// panelBytes is the panel size of one block.
	panelBytes int
}{
	Q8_0: {qpackQ8_0AVX512, dot32AVX512, 9 * 64},
	Q4_0: {qpackQ4_0AVX512, dot32AVX512, 9 * 64},
	Q4_K: {qpackQ4_KAVX512, dotKAVX512, 78 * 64},
	Q5_K: {qpackQ5_KAVX512, dotKAVX512, 78 * 64},
	Q6_K: {qpackQ6_KAVX512, dot6KAVX512, 89 * 64},
}

var dot32AVX512 = []qdot{qdot32AVX512R1, qdot32AVX512R2, qdot32AVX512R3, qdot32AVX512R4,
	qdot32AVX512R5, qdot32AVX512R6, qdot32AVX512R7, qdot32AVX512R8}

var dotKAVX512 = []qdot{qdotKAVX512R1, qdotKAVX512R2, qdotKAVX512R3, qdotKAVX512R4, qdotKAVX512R5, qdotKAVX512R6}

var dot6KAVX512 = []qdot{qdot6KAVX512R1, qdot6KAVX512R2, qdot6KAVX512R3, qdot6KAVX512R4, qdot6KAVX512R5, qdot6KAVX512R6}

// qPanelTarget bounds the panel of one chunk of blocks (it stays in L1 or
// L2 while the activation rows pass over it).
const qPanelTarget = 32 << 10

// qScratch is a worker's scratch for qmmAVX512.
type qScratch struct {
	panel []byte
	acc   []float32
	pad   []byte
}

var qScratches = sync.Pool{New: func() any { return new(qScratch) }}

// aligned64 returns a slice of n bytes of buf (grown if needed) starting
// at a 64-byte boundary.
func aligned64(buf *[]byte, n int) []byte {
	if cap(*buf) < n+64 {
		*buf = make([]byte, n+64)
	}
	b := (*buf)[:n+64]
	off := int(-uintptr(unsafe.Pointer(&b[0])) & 63)
	return b[off : off+n]
}

// qmmAVX512 computes out[i*Rows+j] for i < m, lo ≤ j < hi.
func qmmAVX512(a *qAct, w *Mat, lo, hi int, out []float32) {
	ks, ok := qKernels512[w.DType]
	if !ok {
		qmmGo(a, w, lo, hi, out)
		return
	}
	n, k, m := w.Rows, a.k, a.m
	rb, _ := w.DType.RowBytes(k)
	elems, bytes := w.DType.BlockSize()
	words, _ := metaWords(w.DType)
	nb := k / elems
	chunk := max(1, qPanelTarget/ks.panelBytes)
	sc := qScratches.Get().(*qScratch)
	defer qScratches.Put(sc)
	panel := aligned64(&sc.panel, min(chunk, nb)*ks.panelBytes)
	if cap(sc.acc) < m*16 {
		sc.acc = make([]float32, m*16)
	}
	acc := sc.acc[:m*16]
	for j0 := lo; j0 < hi; j0 += 16 {
		rows := min(16, hi-j0)
		wq := w.Q[j0*rb:]
		if rows < 16 {
			// Fewer than 16 rows left: pack copies padded with zeros.
			if cap(sc.pad) < 16*rb {
				sc.pad = make([]byte, 16*rb)
			}
			wq = sc.pad[:16*rb]
			clear(wq[copy(wq, w.Q[j0*rb:(j0+rows)*rb]):])
		}
		clear(acc)
		for b0 := 0; b0 < nb; b0 += chunk {
			c := min(chunk, nb-b0)
			ks.pack(&wq[b0*bytes], rb, c, &panel[0])
			for i := 0; i < m; i += len(ks.dot) {
				r := min(len(ks.dot), m-i)
				ks.dot[r-1](&a.xq[i*k+b0*elems], k, &a.meta[(i*nb+b0)*words], nb*words*4, &panel[0], c, &acc[i*16])
			}
		}
		for i := range m {
			copy(out[i*n+j0:i*n+j0+rows], acc[i*16:i*16+rows])
		}
	}
}
