package sample

import (
	"math"
	"math/bits"
	"slices"
	"sync"

	"github.com/tandem-serve/tandem/internal/tensor"
)

// cand is a candidate token and its unnormalized probability.
type cand struct {
	w  float32
	id int32
}

// entry is a token and its logit in a bounded top-N heap.
type entry struct {
	v  float32
	id int32
}

// better orders entries by descending value, then ascending id.
func (e entry) better(o entry) bool {
	return e.v > o.v || (e.v == o.v && e.id < o.id)
}

// scratch holds the per-call buffers of Sample. They are pooled, not kept
// per Sampler, so memory does not grow with the number of requests. The
// buffers marked "zeroed" are all zeros, and rawFits is false, whenever a
// scratch is free; the rest are overwritten before they are read.
type scratch struct {
	x   []float32 // processed logits
	raw expRow    // exponentials of the raw logits, for logprobs
	row expRow    // sampling weights
	// rawFits says raw holds this call's sampling weights at temperature
	// 1: the logits were not processed.
	rawFits bool

	counts  []int32 // penalties' token counts, zeroed
	touched []int32
	ids     []int32 // indices from tensor.AppendAbove
	cands   []cand
	vals    []float32
	heap    topHeap
	top     []entry // logprob alternatives
	seen    []bool  // blocks already searched for the raw top-N

	dense []float32 // draw's scatter target, zeroed
	sums  []float32 // block sums of a draw

	// byWeight's and nucleusFloor's histograms, zeroed.
	mass       []float64
	low        [1 << 10]float64
	floorMass  [1 << (31 - floorShift)]float64
	floorCount [1 << (31 - floorShift)]int32
	pos        []int32
	sub        [2][]cand
}

// scratches is a free list rather than a sync.Pool: a Pool empties at
// every garbage collection, and refilling vocabulary-sized buffers would
// then allocate about a megabyte in the calls that follow. The list holds
// as many scratches as Sample calls (and draws inside them) ever ran at
// once.
var scratches struct {
	sync.Mutex
	free []*scratch
}

// getScratch returns a free scratch whose penalty counts cover n tokens;
// the other buffers grow where they are used.
func getScratch(n int) *scratch {
	scratches.Lock()
	var sc *scratch
	if k := len(scratches.free); k > 0 {
		sc = scratches.free[k-1]
		scratches.free = scratches.free[:k-1]
	}
	scratches.Unlock()
	if sc == nil {
		sc = new(scratch)
	}
	sc.counts = resize(sc.counts, n)
	return sc
}

func putScratch(sc *scratch) {
	sc.rawFits = false // the weights belong to the call that is ending
	scratches.Lock()
	scratches.free = append(scratches.free, sc)
	scratches.Unlock()
}

// resize returns b with length n, reallocating (zeroed) only when its
// capacity is short, so buffers kept all zero stay so.
func resize[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// The scans below test entries 16 at a time, in two inlinable groups of 8,
// and look at single entries only in the rare groups that pass: a compare
// and a predictable branch per entry is as fast as Go code gets without
// vector instructions.

// atLeastLo and atLeastHi report whether some entry of b[:8] or b[8:] is
// at least t.
func atLeastLo(b *[16]float32, t float32) bool {
	return b[0] >= t || b[1] >= t || b[2] >= t || b[3] >= t || b[4] >= t || b[5] >= t || b[6] >= t || b[7] >= t
}

func atLeastHi(b *[16]float32, t float32) bool {
	return b[8] >= t || b[9] >= t || b[10] >= t || b[11] >= t || b[12] >= t || b[13] >= t || b[14] >= t || b[15] >= t
}

// argmax returns the index of the largest value, the lowest on ties; NaN
// never wins, and with no value above -Inf it returns 0.
func argmax(x []float32) int32 {
	i, _ := tensor.ArgMax(x)
	return int32(i)
}

// topHeap keeps the best k entries offered, in a min-heap whose root is
// the worst kept.
type topHeap struct {
	h []entry
	k int
	// tie is the value of the last entry dropped while equal to the worst
	// kept (NaN if none): if it equals the final threshold, entries with
	// that value are missing from h.
	tie float32
}

func (t *topHeap) reset(k int) {
	t.h, t.k, t.tie = t.h[:0], k, float32(math.NaN())
}

// threshold is the least value that can still enter: -Inf until the heap
// holds k entries.
func (t *topHeap) threshold() float32 {
	if len(t.h) < t.k {
		return negInf
	}
	return t.h[0].v
}

// tiesDropped reports whether entries equal to the k-th value were left
// out.
func (t *topHeap) tiesDropped() bool {
	return len(t.h) == t.k && t.tie == t.h[0].v
}

func (t *topHeap) offer(e entry) {
	h := t.h
	if len(h) < t.k {
		h = append(h, e)
		for i := len(h) - 1; i > 0; { // sift up
			p := (i - 1) / 2
			if !h[p].better(h[i]) {
				break
			}
			h[p], h[i] = h[i], h[p]
			i = p
		}
		t.h = h
		return
	}
	if !e.better(h[0]) {
		if e.v == h[0].v {
			t.tie = e.v
		}
		return
	}
	old := h[0]
	h[0] = e
	for i := 0; ; { // sift down
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		w := l
		if r := l + 1; r < len(h) && h[l].better(h[r]) {
			w = r
		}
		if !h[i].better(h[w]) {
			break
		}
		h[i], h[w] = h[w], h[i]
		i = w
	}
	if old.v == h[0].v {
		t.tie = old.v
	}
}

// scan offers the entries of x that can enter; x[0] is token base. NaN
// never enters.
func (t *topHeap) scan(x []float32, base int) {
	thr := t.threshold()
	i := 0
	for ; i+16 <= len(x); i += 16 {
		b := (*[16]float32)(x[i : i+16])
		if atLeastLo(b, thr) || atLeastHi(b, thr) {
			for j, v := range b {
				if v >= thr {
					t.offer(entry{v: v, id: int32(base + i + j)})
					thr = t.threshold()
				}
			}
		}
	}
	for ; i < len(x); i++ {
		if v := x[i]; v >= thr {
			t.offer(entry{v: v, id: int32(base + i)})
			thr = t.threshold()
		}
	}
}

// sorted returns the kept entries best first.
func (t *topHeap) sorted() []entry {
	slices.SortFunc(t.h, func(a, b entry) int {
		if a.better(b) {
			return -1
		}
		return 1
	})
	return t.h
}

// appendAtLeast appends to cs the ids of the entries of x at least t and
// above -Inf. (x >= t is x above the next float below t.)
func appendAtLeast(cs []cand, x []float32, t float32) []cand {
	t = max(t, -math.MaxFloat32)
	sc := getScratch(0)
	defer putScratch(sc)
	sc.ids = tensor.AppendAbove(sc.ids[:0], x, math.Nextafter32(t, negInf))
	cs = slices.Grow(cs, len(sc.ids))
	for _, id := range sc.ids {
		cs = append(cs, cand{id: id})
	}
	return cs
}

// collect appends to cs the tokens whose weight in w (all >= 0) is above
// floor and, with minP > 0, at least minP times the largest weight. It
// returns cs and, with minP > 0, the largest weight, exact whenever it is
// above floor. dense says that many weights (more than about one in eight)
// are expected above floor; the vector scan behind collectSparse and
// collectDense does not need the hint, but a Go collector would.
func collect(cs []cand, w []float32, floor, minP float32, dense bool) ([]cand, float32) {
	switch {
	case minP > 0:
		return collectMinP(cs, w, floor, minP)
	case dense:
		return collectDense(cs, w, floor), 0
	}
	return collectSparse(cs, w, floor), 0
}

// collectSparse appends to cs the tokens whose weight is above floor, in
// id order, found by tensor.AppendAbove's vector scan.
func collectSparse(cs []cand, w []float32, floor float32) []cand {
	sc := getScratch(0)
	defer putScratch(sc)
	sc.ids = tensor.AppendAbove(sc.ids[:0], w, floor)
	cs = slices.Grow(cs, len(sc.ids))
	for _, id := range sc.ids {
		cs = append(cs, cand{w: w[id], id: id})
	}
	return cs
}

// collectDense is collectSparse: the vector scan costs about the same
// however many weights pass. It stays a separate name for collect's
// callers, which say which case they expect.
func collectDense(cs []cand, w []float32, floor float32) []cand {
	return collectSparse(cs, w, floor)
}

// collectMinP collects with a cut that rises with the largest weight seen;
// min-p keeps few tokens, so the groups that pass are rare.
func collectMinP(cs []cand, w []float32, floor, minP float32) ([]cand, float32) {
	lo := math.Nextafter32(floor, 1)
	var wmax float32
	thr := lo
	// An entry below thr cannot raise wmax: thr <= wmax unless lo > wmax,
	// and then wmax is only needed if some entry is above lo.
	add := func(v float32, id int) {
		if v > wmax {
			wmax = v
			thr = max(lo, minP*wmax)
		}
		cs = append(cs, cand{w: v, id: int32(id)})
	}
	i := 0
	for ; i+16 <= len(w); i += 16 {
		b := (*[16]float32)(w[i : i+16])
		if atLeastLo(b, thr) || atLeastHi(b, thr) {
			for j, v := range b {
				if v >= thr {
					add(v, i+j)
				}
			}
		}
	}
	for ; i < len(w); i++ {
		if v := w[i]; v >= thr {
			add(v, i)
		}
	}
	// Entries taken before wmax rose may be below the final cut.
	cut := minP * wmax
	cs = slices.DeleteFunc(cs, func(c cand) bool { return c.w < cut })
	return cs, wmax
}

// heapLimit is the largest k for which top-k uses a heap; beyond it an
// O(V) quickselect on a copy is cheaper than O(V log k) sifting.
const heapLimit = 256

// selectDesc returns the k-th largest value of v (1-based), reordering v.
// It is a three-way quickselect with median-of-three pivots that falls back
// to sorting when the partitions keep coming out lopsided.
func selectDesc(v []float32, k int) float32 {
	budget := 2 * bits.Len(uint(len(v)))
	for len(v) > 16 && budget > 0 {
		budget--
		pv := median3(v[0], v[len(v)/2], v[len(v)-1])
		// v[:a] > pv, v[a:b] == pv, v[b:] < pv
		a, i, b := 0, 0, len(v)
		for i < b {
			switch x := v[i]; {
			case x > pv:
				v[a], v[i] = v[i], v[a]
				a++
				i++
			case x < pv:
				b--
				v[i], v[b] = v[b], v[i]
			default:
				i++
			}
		}
		switch {
		case k <= a:
			v = v[:a]
		case k <= b:
			return pv
		default:
			v, k = v[b:], k-b
		}
	}
	slices.SortFunc(v, func(a, b float32) int {
		switch {
		case a > b:
			return -1
		case a < b:
			return 1
		}
		return 0
	})
	return v[k-1]
}

func median3(a, b, c float32) float32 {
	if a > b {
		a, b = b, a
	}
	if b > c {
		b = c
	}
	if a > b {
		return a
	}
	return b
}
