package tensor

import (
	"sync"
	"unsafe"
)

// The drivers of the assembly quantized kernels.
//
// Panels (more than one activation row): for each group of lanes weight
// rows (16 with AVX-512, 8 with AVX2), a pack kernel lays a chunk of their
// blocks out as a panel with one weight row per vector lane (levels
// transposed to 4-byte groups, scales widened), and dot kernels run the
// activation rows over it a few at a time, continuing lanes f32 chains per
// activation row (one per weight row) in acc.
//
// Rows (one activation row, decode): a row kernel takes up to qRowMax
// weight rows and reads each from start to end, the one access pattern
// that streams from DRAM at full speed (see asmgen's rowquant.go); the
// AVX2 ones read a few rows side by side, from as many regions of the
// rows a thread was given (runRows), so that each region is one sequential
// stream across calls (see asmgen's rowstreams.go).
//
// Either way the chains are those of the definition in qmatmul.go, so
// every kernel gives its results bit for bit.

type (
	// qpack packs nb blocks of a group of weight rows ldw bytes apart
	// into the panel at dst, and prefetches the lanes·nb·blockBytes bytes
	// from pf (an address only, never dereferenced).
	qpack func(w *byte, ldw int, nb int, dst *byte, pf uintptr)
	// qdot continues the chains of a fixed number of activation rows
	// (ldx bytes of int8 apart, their metadata ldm bytes apart) over nb
	// blocks of a panel; acc holds lanes f32 per row.
	qdot func(x *int8, ldx int, meta *uint32, ldm int, panel *byte, nb int, acc *float32)
	// qrow computes up to qRowMax weight rows ldw bytes apart times one
	// activation row (its levels x, metadata meta and the per-block
	// arrays aux of qAct.rowAux) into out[0:qRowMax], reading each weight
	// row from start to end (see asmgen's rowquant.go); scratch holds
	// qRowKernel.scratchBytes(nb) bytes.
	qrow func(w *byte, ldw int, rows int, nb int, x *int8, meta *uint32, aux *uint32, scratch *byte, out *float32)
	// qrowStreams is qrow for a kernel that reads streams weight rows
	// side by side: with q = rows / streams, row s·q + i of the call
	// (s < streams, i < q) is at w + s·lds + i·ldw, and the rows past
	// streams·q follow the last stream's (see asmgen's rowstreams.go).
	qrowStreams func(w *byte, ldw int, rows int, nb int, x *int8, meta *uint32, aux *uint32, scratch *byte, out *float32, lds int)
	// qrow8 computes the 8 weight rows w + s·lds (s < 8) times one
	// activation row into out[0:8], all 8 a block at a time, the chains in
	// the lanes of one vector (see asmgen's row8.go).
	qrow8 func(w *byte, lds int, nb int, x *int8, aux *uint32, out *float32)
	// qrow8K is qrow8 for the K-quants, which also read the activation
	// metadata.
	qrow8K func(w *byte, lds int, nb int, x *int8, meta *uint32, aux *uint32, out *float32)
)

// qRowMax is the most weight rows one qrow call takes.
const qRowMax = 8

// qRowKernel is a dtype's row kernel: it needs at least group blocks per
// row and slot bytes of scratch per group of blocks and row.
type qRowKernel struct {
	// fn, or fnStreams with streams (a power of 2 up to qRowMax) rows
	// read side by side.
	fn        qrow
	fnStreams qrowStreams
	streams   int
	// fn8 or fn8K, where set, takes the rows of 8 regions, one of each
	// a call; fn or fnStreams the rows past them.
	fn8         qrow8
	fn8K        qrow8K
	group, slot int
	// perm: the kernel takes the activations in qAct.rowX's order.
	perm bool
	// quad, where set, replaces this kernel for rows of a multiple of 4
	// blocks (the 32-block kernels of AVX512-VBMI, which need qAct.rowX's
	// order for them).
	quad *qRowKernel
}

// scratchBytes is the scratch a call with nb blocks per row needs.
func (r qRowKernel) scratchBytes(nb int) int {
	return qRowMax * (nb + r.group - 1) / r.group * r.slot
}

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
	// row, where set, replaces pack and dot for one activation row
	// (decode) when the weight rows have at least its group of blocks.
	row map[DType]qRowKernel
	// amx runs each group of 16 activation rows of the products whose
	// dot kernels read 32-weight blocks with AMX (amxqmm_amd64.go).
	amx bool
}

// qPanelTarget bounds the panel of one chunk of blocks (it stays in L1 or
// L2 while the activation rows pass over it).
const qPanelTarget = 32 << 10

// qScratch is a worker's scratch for the panel driver.
type qScratch struct {
	panel, scratch []byte
	acc            []float32
	rowOut         [qRowMax]float32
	pad            []byte
	// amxTile is the tiles the AMX kernels store (amxRun).
	amxTile []int32
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
	elems, _ := w.DType.BlockSize()
	nb := a.k / elems
	sc := qScratches.Get().(*qScratch)
	defer qScratches.Put(sc)
	if rk, ok := s.row[w.DType]; ok && a.m == 1 && nb >= rk.group {
		s.runRows(rk, sc, a, w, lo, hi, out)
		return
	}
	s.runPanels(ks, sc, a, w, lo, hi, out)
}

// runRows is run for one activation row with a row kernel.
func (s *qKernelSet) runRows(rk qRowKernel, sc *qScratch, a *qAct, w *Mat, lo, hi int, out []float32) {
	rb, _ := w.DType.RowBytes(a.k)
	elems, _ := w.DType.BlockSize()
	nb := a.k / elems
	if rk.quad != nil && nb%4 == 0 {
		rk = *rk.quad
	}
	scratch := aligned64(&sc.scratch, rk.scratchBytes(nb))
	x := &a.xq[0]
	if rk.perm {
		x = &a.rowX[0]
	}
	call := func(j0, rows, lds int) {
		if rk.fnStreams != nil {
			rk.fnStreams(&w.Q[j0*rb], rb, rows, nb, x, &a.meta[0], &a.rowAux[0], &scratch[0], &sc.rowOut[0], lds)
		} else {
			rk.fn(&w.Q[j0*rb], rb, rows, nb, x, &a.meta[0], &a.rowAux[0], &scratch[0], &sc.rowOut[0])
		}
	}
	if (rk.fn8 != nil || rk.fn8K != nil) && hi-lo >= qRowMax {
		// The rows in 8 regions of r rows each, a row of each a call;
		// r is chosen so that the regions do not start at the same
		// offset in a page (see row8Regions).
		r := row8Regions((hi-lo)/qRowMax, rb)
		for c := range r {
			if rk.fn8 != nil {
				rk.fn8(&w.Q[(lo+c)*rb], r*rb, nb, x, &a.rowAux[0], &sc.rowOut[0])
			} else {
				rk.fn8K(&w.Q[(lo+c)*rb], r*rb, nb, x, &a.meta[0], &a.rowAux[0], &sc.rowOut[0])
			}
			for s := range qRowMax {
				out[lo+s*r+c] = sc.rowOut[s]
			}
		}
		lo += qRowMax * r
	}
	if st := rk.streams; rk.fnStreams != nil && st > 1 {
		// The rows in st regions of r rows each, read side by side, q
		// rows of each a call: every stream stays sequential from one
		// call to the next.
		q := qRowMax / st
		r := (hi - lo) / qRowMax * q
		for c := 0; c < r; c += q {
			call(lo+c, qRowMax, r*rb)
			for s := range st {
				j := lo + s*r + c
				copy(out[j:j+q], sc.rowOut[s*q:(s+1)*q])
			}
		}
		lo += st * r
	}
	for j0 := lo; j0 < hi; j0 += qRowMax {
		rows := min(qRowMax, hi-j0)
		q := rows / max(rk.streams, 1)
		call(j0, rows, q*rb)
		copy(out[j0:j0+rows], sc.rowOut[:rows])
	}
}

// runPanels is run with the pack and dot kernels.
func (s *qKernelSet) runPanels(ks qTypeKernels, sc *qScratch, a *qAct, w *Mat, lo, hi int, out []float32) {
	lanes := s.lanes
	n, k, m := w.Rows, a.k, a.m
	rb, _ := w.DType.RowBytes(k)
	elems, bytes := w.DType.BlockSize()
	words, _ := metaWords(w.DType)
	nb := k / elems
	chunk := max(1, qPanelTarget/ks.panelBytes)
	panel := aligned64(&sc.panel, min(chunk, nb)*ks.panelBytes)
	if cap(sc.acc) < m*lanes {
		sc.acc = make([]float32, m*lanes)
	}
	acc := sc.acc[:m*lanes]
	var ad *amxDot
	amxRows := 0
	if s.amx {
		ad, amxRows = amxFor(ks.dot, a)
	}
	// Each pack call prefetches the part of the next group of rows (the
	// groups are contiguous) that matches its blocks, so the weights
	// stream from DRAM in order, a group ahead; the last group re-touches
	// itself.
	wbase := uintptr(unsafe.Pointer(&w.Q[0]))
	for j0 := lo; j0 < hi; j0 += lanes {
		rows := min(lanes, hi-j0)
		next := wbase + uintptr((j0+lanes)*rb)
		if j0+lanes >= hi {
			next = wbase + uintptr(j0*rb)
		}
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
		for b0 := 0; b0 < nb; b0 += chunk {
			c := min(chunk, nb-b0)
			ks.pack(&wq[b0*bytes], rb, c, &panel[0], next+uintptr(b0*lanes*bytes))
			if amxRows > 0 {
				amxRun(sc, a, ad, amxRows, b0, c, &panel[0], acc)
			}
			for i := amxRows; i < m; i += len(ks.dot) {
				r := min(len(ks.dot), m-i)
				ks.dot[r-1](&a.xq[i*k+b0*elems], k, &a.meta[(i*nb+b0)*words], nb*words*4, &panel[0], c, &acc[i*lanes])
			}
		}
		storeAcc(out[j0:], n, acc, lanes, rows, m)
	}
}

// storeAcc copies the first rows chains of each of the m activation rows'
// lanes chains in acc to out (row i at out[i*ldo:]). A full group of 8 or 16
// goes through a local array, which the compiler copies with vector moves
// (a direct array assignment between two slices calls memmove, since they
// might overlap): a prefill makes one copy per activation row and group of
// weight rows.
func storeAcc(out []float32, ldo int, acc []float32, lanes, rows, m int) {
	switch {
	case rows == 8 && lanes == 8:
		for i := range m {
			v := *(*[8]float32)(acc[i*8:])
			*(*[8]float32)(out[i*ldo:]) = v
		}
	case rows == 16 && lanes == 16:
		for i := range m {
			v := *(*[16]float32)(acc[i*16:])
			*(*[16]float32)(out[i*ldo:]) = v
		}
	default:
		for i := range m {
			copy(out[i*ldo:i*ldo+rows], acc[i*lanes:i*lanes+rows])
		}
	}
}

// row8Regions is the rows per region of the 8-row kernels' 8 regions
// (r·rb bytes apart, rb the bytes of a row), at most r: r where its 8
// streams lie at least 256 bytes apart modulo 4096, else the one among r,
// r − 1, … that puts them farthest apart, going down at most r/32 rows (7
// at the most: the rows past the regions, at most 3% more, go to the
// slower kernels; at r < 32, none). Streams at one offset in a page (r·rb
// a multiple of 4096, as for 2048 rows of any K-quant or Q8_0: r = 256)
// map to the same set of the level-1 data cache, which then holds one
// line of each and no more; with the 8-row kernels on the Zen 2 this held
// the cold rates at 53–78% of the read limit, and spreading the streams
// raised them by 9–49% (docs/performance-log.md, "K-quant decode cold rates:
// the 8-row kernels' streams spread over the cache sets").
func row8Regions(r, rb int) int {
	if streamsApart(r*rb) >= 256 {
		return r
	}
	best, far := r, -1
	for c := r; c >= r-min(qRowMax-1, r/32); c-- {
		if d := streamsApart(c * rb); d > far {
			best, far = c, d
		}
	}
	return best
}

// streamsApart is the smallest distance modulo 4096 between two of 8
// streams lds bytes apart.
func streamsApart(lds int) int {
	near := 4096
	for s := 1; s < qRowMax; s++ {
		// Streams i and i + s are s·lds apart.
		d := s * lds % 4096
		near = min(near, d, 4096-d)
	}
	return near
}
