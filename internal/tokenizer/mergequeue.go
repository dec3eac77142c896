package tokenizer

// queuedMerge is one entry of a merge queue, the binary min-heap both merge
// models (bpe.go, spm.go) take their next merge from: the smallest key
// first, the leftmost pos on equal keys. BPE keys by merge rank;
// SentencePiece by its score negated, so the highest score comes first
// (negating keeps every comparison as it was, ±0 and NaN included).
//
// The order is on the struct's own fields rather than on a method of a
// type parameter: a method called through the instantiation's dictionary
// does not inline, and that made BPE merges slower
// (BenchmarkBPEWordCache/uncached, 2026-12-05). Comparing fields compiles
// to the plain comparison for each instantiation, and pushMerge still
// inlines into both merge loops.
type queuedMerge[K int32 | float32, P int32 | int, V any] struct {
	key K // smaller merges first
	pos P // the left symbol of the pair; the leftmost merges first on equal keys
	val V // what the model needs to apply the merge
}

func (a queuedMerge[K, P, V]) before(b queuedMerge[K, P, V]) bool {
	return a.key < b.key || (a.key == b.key && a.pos < b.pos)
}

// pushMerge and popMerge keep the heap in a slice. They are plain
// functions taking and returning the slice, rather than container/heap or
// methods on a pointer, so that BPE's small backing array can stay on
// mergeWord's stack.
func pushMerge[K int32 | float32, P int32 | int, V any](h []queuedMerge[K, P, V], m queuedMerge[K, P, V]) []queuedMerge[K, P, V] {
	h = append(h, m)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h[i].before(h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func popMerge[K int32 | float32, P int32 | int, V any](h []queuedMerge[K, P, V]) (queuedMerge[K, P, V], []queuedMerge[K, P, V]) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && h[l].before(h[m]) {
			m = l
		}
		if r < len(h) && h[r].before(h[m]) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	return top, h
}
