package model

import (
	"math"

	"github.com/tandem-serve/tandem/internal/tensor"
)

// Key segments: the outer level of every query's reduction order.
//
// A query's keys are cut into segments at fixed positions, [0, S), [S,
// 2S), ... (S = attnSegKeys, a multiple of the key chunk), its window's
// start cutting the first one. Each segment's chunks run the online softmax
// of the top of attention.go from a fresh state (running maximum −Inf, sum
// and accumulators 0), and at the segment's end that state (m, l, acc) is
// folded into the query's running state (M, L, A), segment after segment in
// position order, by mergeSegment:
//
//   - a segment without keys for the query (m = −Inf) changes nothing;
//   - the first segment with keys becomes the running state as it is;
//   - if m > M: f = e^(M−m) (tensor.ExpSum of one element), A[t] = acc[t] +
//     f·A[t] (tensor.Axpy, whose rounding, fused or not, is the ISA's),
//     L = L·f + l, M = m;
//   - else: f = e^(m−M), A[t] = A[t] + f·acc[t] (tensor.Axpy), L = L + l·f;
//
// and out[t] = A[t]·(1/L) at the end. A query whose keys lie in one segment
// (every one at positions below S) gets the bits it got before segments
// existed.
//
// Segments are what lets a single long decode token be shared by the
// threads without giving up the one stream of whole pool rows that the
// kernels prefetch (attention_prefetch.go): split by KV head, a thread's
// rows are one head's slices of the rows, not contiguous. A token split by
// segments is one item per part of its segments, each for every KV head;
// the items leave each segment's state in the token's part of s.segBuf
// (instead of folding it), and after the items ran, mergeParts folds them
// in position order with mergeSegment into the outputs. Folding a segment
// as it ends (one thread) and folding the stored states afterwards run the
// same operations on the same values, so a token's outputs do not depend
// on whether it was split, as they did not before.

// attnSegKeys is the key segment length S (see above): a multiple of
// attnKeyChunk, and part of the reduction order, like it.
const attnSegKeys = 512

// segKeys returns the key segment length: attnSegKeys, or the shorter one
// a test sets to cross segment boundaries with short sequences.
func (m *Model) segKeys() int {
	if m.attnSeg > 0 {
		return m.attnSeg
	}
	return attnSegKeys
}

// attnPart is the share of a decode token's key segments one work item
// computes: with n > 0, part k of n of the segments the token's query sees
// in the layer (n parts of as many segments as full attention has; a
// window leaves fewer, and some parts empty), each segment's states left in
// buf; with n = 0, every key, the outputs normalised.
type attnPart struct {
	k, n int
	buf  []float32 // the token's partial states: segStride floats a segment
}

// keyRange returns the keys [lo, hi) the item walks for queries whose keys
// start at ws and whose last one is end−1: all of them, or part k of n of
// the segments they touch (lo ≥ hi when the part is empty).
func (pt attnPart) keyRange(S, ws, end int) (lo, hi int) {
	if pt.n == 0 {
		return ws, end
	}
	g0, g1 := ws/S, (end-1)/S+1
	a, b := g0+pt.k*(g1-g0)/pt.n, g0+(pt.k+1)*(g1-g0)/pt.n
	return max(ws, a*S), min(end, b*S)
}

// segStride is the floats a segment's partial states take in a split
// token's buffer: the unnormalised outputs of every query head, then their
// maxima, then their sums.
func segStride(heads, hd int) int { return heads * (hd + 2) }

// resetRunning empties the running state of R rows (M = −Inf).
func (w *attnScratch) resetRunning(R int) {
	negInf := float32(math.Inf(-1))
	for r := range R {
		w.rm[r], w.rl[r] = negInf, 0
	}
	w.runEmpty = true
}

// closeSegment ends segment g for the R rows of the scratch: their
// segment states are folded into the running states (pt.n = 0) or stored
// in the token's buffer (a split token, R = its query heads), and
// restarted. While every running state is empty (the item's first
// segment), folding is taking each segment state as it is, a row without
// keys staying empty: the buffers change places instead.
func (w *attnScratch) closeSegment(R, hd, g int, pt attnPart) {
	switch {
	case pt.n > 0:
		b := pt.buf[g*segStride(R, hd):][:segStride(R, hd)]
		copy(b, w.acc[:R*hd])
		copy(b[R*hd:], w.mx[:R])
		copy(b[R*hd+R:], w.l[:R])
	case w.runEmpty:
		w.acc, w.racc = w.racc, w.acc
		w.mx, w.rm = w.rm, w.mx
		w.l, w.rl = w.rl, w.l
		w.runEmpty = false
	default:
		for r := range R {
			mergeSegment(&w.rm[r], &w.rl[r], w.racc[r*hd:][:hd], w.mx[r], w.l[r], w.acc[r*hd:][:hd], &w.factor)
		}
	}
	w.reset(R, hd)
}

// mergeSegment folds a segment's state (maximum m, sum l, unnormalised
// outputs acc, which it may overwrite) into a query's running state (M, L,
// A), in the one order described above; f is a scratch element for the
// exponential.
func mergeSegment(M, L *float32, A []float32, m, l float32, acc []float32, f *[1]float32) {
	switch {
	case math.IsInf(float64(m), -1):
	case math.IsInf(float64(*M), -1):
		copy(A, acc)
		*M, *L = m, l
	case m > *M:
		f[0] = *M
		e := tensor.ExpSum(f[:], m)
		tensor.Axpy(e, A, acc)
		copy(A, acc)
		*L = *L*e + l
		*M = m
	default:
		f[0] = m
		e := tensor.ExpSum(f[:], *M)
		tensor.Axpy(e, acc, A)
		*L += l * e
	}
}

// writeOutputs writes the normalised outputs of the item's rows (tokens
// [t0, t0+ntok) of the batch, KV heads [kh0, kh1), rows ordered as in
// attendTile) from their running states.
func (m *Model) writeOutputs(w *attnScratch, t0, ntok, kh0, kh1 int) {
	c := &m.cfg
	hd, group := c.HeadDim, c.Heads/c.KVHeads
	perHead := ntok * group
	for kvh := kh0; kvh < kh1; kvh++ {
		for tok := range ntok {
			for gi := range group {
				r := (kvh-kh0)*perHead + tok*group + gi
				h := kvh*group + gi
				normalise(m.s.attn[(t0+tok)*c.QDim()+h*hd:][:hd], w.racc[r*hd:][:hd], w.rl[r])
			}
		}
	}
}

// normalise writes out[t] = acc[t]·(1/l).
func normalise(out, acc []float32, l float32) {
	inv := 1 / l
	for i, v := range acc {
		out[i] = v * inv
	}
}

// segToken is a decode token split by key segments: its tile and where
// its partial states start in s.segBuf.
type segToken struct {
	tile int32
	buf  int
}

// mergeParts folds, for every split decode token, the partial states its
// items left for the segments its query sees in layer li, in position
// order, and writes its normalised outputs.
func (m *Model) mergeParts(li int) {
	c := &m.cfg
	s := &m.s
	hd, S := c.HeadDim, m.segKeys()
	stride := segStride(c.Heads, hd)
	s.segRun = grow(s.segRun, hd)
	A := s.segRun
	var f [1]float32
	for _, st := range s.segToks {
		t := int(s.tiles[st.tile].t0)
		p := int(s.tokPos[t])
		ws := windowStart(p, m.layers[li].window)
		for h := range c.Heads {
			M, L := float32(math.Inf(-1)), float32(0)
			for g := ws / S; g <= p/S; g++ {
				b := s.segBuf[st.buf+g*stride:][:stride]
				mergeSegment(&M, &L, A, b[c.Heads*hd+h], b[c.Heads*(hd+1)+h], b[h*hd:][:hd], &f)
			}
			normalise(s.attn[t*c.QDim()+h*hd:][:hd], A, L)
		}
	}
}
