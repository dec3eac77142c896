package sample

import (
	"math/bits"
	"slices"
	"sync"
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
// per Sampler, so memory does not grow with the number of requests. counts
// is all zeros and wRaw false whenever a scratch is in the pool.
type scratch struct {
	x []float32 // processed logits
	w []float32 // dense weights
	// wRaw says w holds exp(x - max(x)) of the unprocessed logits of the
	// current call, summing to wSum.
	wRaw    bool
	wSum    float64
	vals    []float32
	counts  []int32
	touched []int32
	cands   []cand
	heap    []entry
	top     []entry // logprob alternatives, kept apart from heap (top-k)
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func getScratch(n int) *scratch {
	sc := scratchPool.Get().(*scratch)
	if cap(sc.x) < n {
		sc.x = make([]float32, n)
		sc.w = make([]float32, n)
		sc.counts = make([]int32, n)
		sc.cands = make([]cand, 0, n)
	}
	return sc
}

func putScratch(sc *scratch) {
	sc.wRaw = false // the weights belong to the call that is ending
	scratchPool.Put(sc)
}

// heapLimit is the largest k for which top-k uses a heap; beyond it an
// O(V) quickselect on a copy is cheaper than O(V log k) sifting.
const heapLimit = 256

// heapOffer keeps the best k entries seen so far in h, a min-heap whose
// root is the worst kept entry.
func heapOffer(h []entry, k int, e entry) []entry {
	if len(h) < k {
		h = append(h, e)
		// sift up
		for i := len(h) - 1; i > 0; {
			p := (i - 1) / 2
			if !h[p].better(h[i]) {
				break
			}
			h[p], h[i] = h[i], h[p]
			i = p
		}
		return h
	}
	if !e.better(h[0]) {
		return h
	}
	h[0] = e
	// sift down
	for i := 0; ; {
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
	return h
}

// kthLargest returns the k-th largest value of x (counting repeats), for
// 1 <= k <= len(x).
func kthLargest(x []float32, k int, sc *scratch) float32 {
	if k <= heapLimit {
		h := sc.heap[:0]
		for i, v := range x {
			if len(h) < k || v > h[0].v {
				h = heapOffer(h, k, entry{v: v, id: int32(i)})
			}
		}
		sc.heap = h
		return h[0].v
	}
	vals := append(sc.vals[:0], x...)
	sc.vals = vals
	return selectDesc(vals, k)
}

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

// nucleus reorders cs so that its first n entries are the top-p nucleus and
// returns n: in descending order of weight (ties: ascending id) a token is
// kept while the weight of the tokens before it is below target, so at least
// one token is kept. This is vLLM's rule (drop a token when the cumulative
// probability up to and including it, counted from the least likely, is at
// most 1-p), found by partitioning on mass instead of sorting the vocabulary.
func nucleus(cs []cand, target float64) int {
	lo, hi := 0, len(cs) // cs[:lo] kept, cs[hi:] dropped, cs[lo:hi] undecided
	var acc float64      // weight of cs[:lo]
	budget := 2 * bits.Len(uint(len(cs)))
	for hi-lo > 16 && budget > 0 {
		budget--
		r := cs[lo:hi]
		pv := median3(r[0].w, r[len(r)/2].w, r[len(r)-1].w)
		a, i, b := 0, 0, len(r)
		for i < b {
			switch w := r[i].w; {
			case w > pv:
				r[a], r[i] = r[i], r[a]
				a++
				i++
			case w < pv:
				b--
				r[i], r[b] = r[b], r[i]
			default:
				i++
			}
		}
		var above float64
		for _, c := range r[:a] {
			above += float64(c.w)
		}
		if acc+above >= target {
			// The cut is inside the heavier group: everything from the
			// pivot down is dropped.
			hi = lo + a
			continue
		}
		acc += above
		eq := r[a:b]
		slices.SortFunc(eq, func(x, y cand) int { return int(x.id) - int(y.id) })
		for j := range eq {
			if acc >= target {
				return lo + a + j
			}
			acc += float64(eq[j].w)
		}
		lo += b
	}
	r := cs[lo:hi]
	slices.SortFunc(r, func(x, y cand) int {
		switch {
		case x.w > y.w:
			return -1
		case x.w < y.w:
			return 1
		}
		return int(x.id) - int(y.id)
	})
	for j := range r {
		if acc >= target {
			return lo + j
		}
		acc += float64(r[j].w)
	}
	return hi
}
