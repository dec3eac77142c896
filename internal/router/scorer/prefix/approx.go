package prefix

import "sync"

// Approx is an approximate Index: it records which block hashes the router
// sent to which engine, keeping the last Capacity blocks per engine (an
// engine's cache holds a bounded number of blocks and evicts the oldest
// first, roughly). It is wrong when an engine evicted earlier or restarted,
// which the precise KV-event index is not; it is what the router has when
// engines publish no events.
type Approx struct {
	mu       sync.Mutex
	capacity int
	holders  map[uint64]map[string]struct{}
	rings    map[string]*ring
}

type ring struct {
	hashes []uint64
	next   int
}

// NewApprox returns an approximate index keeping capacity blocks per engine
// (default 65536 when capacity <= 0).
func NewApprox(capacity int) *Approx {
	if capacity <= 0 {
		capacity = 1 << 16
	}
	return &Approx{capacity: capacity, holders: map[uint64]map[string]struct{}{}, rings: map[string]*ring{}}
}

// Observe records that engine now holds hashes.
func (a *Approx) Observe(engine string, hashes []uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.rings[engine]
	if r == nil {
		r = &ring{hashes: make([]uint64, 0, min(a.capacity, 1024))}
		a.rings[engine] = r
	}
	for _, h := range hashes {
		hs := a.holders[h]
		if hs == nil {
			hs = map[string]struct{}{}
			a.holders[h] = hs
		}
		if _, ok := hs[engine]; ok {
			continue
		}
		hs[engine] = struct{}{}
		if len(r.hashes) < a.capacity {
			r.hashes = append(r.hashes, h)
			continue
		}
		old := r.hashes[r.next]
		r.hashes[r.next] = h
		r.next = (r.next + 1) % a.capacity
		if ohs := a.holders[old]; ohs != nil {
			delete(ohs, engine)
			if len(ohs) == 0 {
				delete(a.holders, old)
			}
		}
	}
}

// Forget drops everything recorded for engine (it was removed or restarted).
func (a *Approx) Forget(engine string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.rings[engine]
	if r == nil {
		return
	}
	for _, h := range r.hashes {
		if hs := a.holders[h]; hs != nil {
			delete(hs, engine)
			if len(hs) == 0 {
				delete(a.holders, h)
			}
		}
	}
	delete(a.rings, engine)
}

// Match implements Index.
func (a *Approx) Match(hashes []uint64, f func(engine string, blocks int)) {
	if len(hashes) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	first := a.holders[hashes[0]]
	if len(first) == 0 {
		return
	}
	cur := make(map[string]struct{}, len(first))
	for e := range first {
		cur[e] = struct{}{}
	}
	for i := 1; i < len(hashes) && len(cur) > 0; i++ {
		hs := a.holders[hashes[i]]
		for e := range cur {
			if _, ok := hs[e]; !ok {
				f(e, i)
				delete(cur, e)
			}
		}
	}
	for e := range cur {
		f(e, len(hashes))
	}
}
