package tensor

import (
	"sync"
	"unsafe"
)

// The panel driver of the assembly quantized kernels. For each group of
// lanes weight rows (16 with AVX-512, 8 with AVX2), a pack kernel lays a
// chunk of their blocks out as a panel with one weight row per vector lane
// (levels transposed to 4-byte groups, scales widened), and dot kernels run
// the activation rows over it a few at a time, continuing lanes f32 chains
// per activation row (one per weight row) in acc: the chains of the
// definition in qmatmul.go, so every kernel gives its results bit for bit.

type (
	// qpack packs nb blocks of a group of weight rows ldw bytes apart
	// into the panel at dst.
	qpack func(w *byte, ldw int, nb int, dst *byte)
	// qdot continues the chains of a fixed number of activation rows
	// (ldx bytes of int8 apart, their metadata ldm bytes apart) over nb
	// blocks of a panel; acc holds lanes f32 per row.
	qdot func(x *int8, ldx int, meta *uint32, ldm int, panel *byte, nb int, acc *float32)
	// qfused continues the chains of one activation row over nb blocks
	// of a group of weight rows ldw bytes apart, without a panel
	// (scratch holds qFusedScratch bytes).
	qfused func(w *byte, ldw int, nb int, x *int8, meta *uint32, scratch *byte, acc *float32)
)

// qFusedScratch is the scratch size of the fused kernels.
const qFusedScratch = 33 * 64

// qTypeKernels are one dtype's kernels in a set.
type qTypeKernels struct {
	pack qpack
	// dot[r-1] takes r activation rows.
	dot []qdot
	// panelBytes is the panel size of one block.
	panelBytes int
}

// qKernelSet is an instruction set's quantized kernels.
type qKernelSet struct {
	lanes int
	types map[DType]qTypeKernels
	// fused, where set, replaces pack and dot for one activation row
	// (decode).
	fused map[DType]qfused
}

// qPanelTarget bounds the panel of one chunk of blocks (it stays in L1 or
// L2 while the activation rows pass over it).
const qPanelTarget = 32 << 10

// qScratch is a worker's scratch for the panel driver.
type qScratch struct {
	panel, scratch []byte
	acc            []float32
	pad            []byte
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

// run computes out[i*Rows+j] for i < m, lo ≤ j < hi.
func (s *qKernelSet) run(a *qAct, w *Mat, lo, hi int, out []float32) {
	ks, ok := s.types[w.DType]
	if !ok {
		qmmGo(a, w, lo, hi, out)
		return
	}
	lanes := s.lanes
	n, k, m := w.Rows, a.k, a.m
	rb, _ := w.DType.RowBytes(k)
	elems, bytes := w.DType.BlockSize()
	words, _ := metaWords(w.DType)
	nb := k / elems
	chunk := max(1, qPanelTarget/ks.panelBytes)
	sc := qScratches.Get().(*qScratch)
	defer qScratches.Put(sc)
	fused := s.fused[w.DType]
	var panel, scratch []byte
	if m == 1 && fused != nil {
		scratch = aligned64(&sc.scratch, qFusedScratch)
	} else {
		fused = nil
		panel = aligned64(&sc.panel, min(chunk, nb)*ks.panelBytes)
	}
	if cap(sc.acc) < m*lanes {
		sc.acc = make([]float32, m*lanes)
	}
	acc := sc.acc[:m*lanes]
	for j0 := lo; j0 < hi; j0 += lanes {
		rows := min(lanes, hi-j0)
		wq := w.Q[j0*rb:]
		if rows < lanes {
			// Fewer rows left than lanes: pack a copy padded with zeros.
			if cap(sc.pad) < lanes*rb {
				sc.pad = make([]byte, lanes*rb)
			}
			wq = sc.pad[:lanes*rb]
			clear(wq[copy(wq, w.Q[j0*rb:(j0+rows)*rb]):])
		}
		clear(acc)
		if fused != nil {
			fused(&wq[0], rb, nb, &a.xq[0], &a.meta[0], &scratch[0], &acc[0])
			copy(out[j0:j0+rows], acc[:rows])
			continue
		}
		for b0 := 0; b0 < nb; b0 += chunk {
			c := min(chunk, nb-b0)
			ks.pack(&wq[b0*bytes], rb, c, &panel[0])
			for i := 0; i < m; i += len(ks.dot) {
				r := min(len(ks.dot), m-i)
				ks.dot[r-1](&a.xq[i*k+b0*elems], k, &a.meta[(i*nb+b0)*words], nb*words*4, &panel[0], c, &acc[i*lanes])
			}
		}
		for i := range m {
			copy(out[i*n+j0:i*n+j0+rows], acc[i*lanes:i*lanes+rows])
		}
	}
}
