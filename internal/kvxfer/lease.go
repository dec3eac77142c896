package kvxfer

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// DefaultLease is how long a producer holds a finished request's blocks for
// the decode engine when no heartbeat arrives (vLLM's kv_lease_duration).
const DefaultLease = 30 * time.Second

// tombstoneTTL is how long a released or expired request is remembered, so
// a late READ gets "expired 3.2 s ago" rather than "unknown request".
const tombstoneTTL = 10 * time.Minute

// maxTombstones bounds that memory whatever the request rate.
const maxTombstones = 1 << 16

// ReleaseReason says why a lease ended.
type ReleaseReason uint8

const (
	// ReleasedDone: the decode engine sent DONE (it read the blocks, or
	// does not need them).
	ReleasedDone ReleaseReason = iota + 1
	// ReleasedExpired: the lease ran out with no DONE.
	ReleasedExpired
	// ReleasedEvicted: a conversation hold (non-renewable) was given up
	// so that new requests get blocks (Producer.Evict).
	ReleasedEvicted
)

// String is the reason's lower-case name (done, expired, evicted).
func (r ReleaseReason) String() string {
	switch r {
	case ReleasedDone:
		return "done"
	case ReleasedExpired:
		return "expired"
	case ReleasedEvicted:
		return "evicted"
	}
	return fmt.Sprintf("ReleaseReason(%d)", uint8(r))
}

// Release tells the engine's step loop that a held request's blocks may be
// freed.
type Release struct {
	RequestID string
	Blocks    []int
	Reason    ReleaseReason
}

// ErrNotHeld means the producer does not hold the request's blocks (unknown
// request, already released, or lease expired). The KV is gone: the decode
// engine must recompute the prompt or fail the request.
var ErrNotHeld = errors.New("kv blocks are not held by the prefill engine")

// ErrBadBlock means a READ named a block that is not part of the held
// request.
var ErrBadBlock = errors.New("block is not part of the held request")

// ErrDuplicateHold means Hold was called twice for the same request id
// without a release in between.
var ErrDuplicateHold = errors.New("request is already held")

type lease struct {
	blocks []int
	gens   []uint64 // generation of blocks[i] when the lease was taken
	index  map[int]int
	expiry time.Time
	since  time.Time // when the hold started (eviction takes the oldest first)
	// fixed: heartbeats do not extend it (a decode's conversation hold:
	// turn 2 is client-driven, vLLM's decoder_kv_blocks_ttl).
	fixed   bool
	readers int           // READs in flight; expiry and release wait for them
	pending ReleaseReason // release requested while readers > 0
}

type tombstone struct {
	reason ReleaseReason
	at     time.Time
}

// leaseTable is the producer's lease state machine. It never reads the clock
// and never does I/O: callers pass now and act on what it returns. It is not
// safe for concurrent use; Producer serializes access.
type leaseTable struct {
	engineID string
	lease    time.Duration
	held     map[string]*lease
	gone     map[string]tombstone
	goneFIFO []string
	released []Release
	nblocks  int // blocks under a live lease
}

func newLeaseTable(engineID string, d time.Duration) *leaseTable {
	return &leaseTable{
		engineID: engineID,
		lease:    d,
		held:     make(map[string]*lease),
		gone:     make(map[string]tombstone),
	}
}

// hold starts a lease of the table's duration on blocks for reqID.
func (t *leaseTable) hold(reqID string, blocks []int, gens []uint64, now time.Time) error {
	return t.holdFor(reqID, blocks, gens, now, t.lease, false)
}

// holdFor starts a lease of duration d; a fixed one ignores heartbeats.
func (t *leaseTable) holdFor(reqID string, blocks []int, gens []uint64, now time.Time, d time.Duration, fixed bool) error {
	if _, ok := t.held[reqID]; ok {
		return fmt.Errorf("hold request %q: %w (release it before holding it again)", reqID, ErrDuplicateHold)
	}
	l := &lease{
		blocks: slices.Clone(blocks),
		gens:   slices.Clone(gens),
		index:  make(map[int]int, len(blocks)),
		expiry: now.Add(d),
		since:  now,
		fixed:  fixed,
	}
	for i, b := range blocks {
		l.index[b] = i
	}
	t.held[reqID] = l
	delete(t.gone, reqID)
	t.nblocks += len(blocks)
	return nil
}

// heartbeat extends each held lease to max(expiry, now + 2/3 lease) and
// returns the ids that are not held.
func (t *leaseTable) heartbeat(ids []string, now time.Time) (notHeld []string) {
	ext := now.Add(t.lease * 2 / 3)
	for _, id := range ids {
		l, ok := t.held[id]
		if !ok || l.pending != 0 {
			notHeld = append(notHeld, id)
			continue
		}
		if !l.fixed && ext.After(l.expiry) {
			l.expiry = ext
		}
	}
	return notHeld
}

// done releases reqID because the decode engine finished with it.
func (t *leaseTable) done(reqID string, now time.Time) error {
	l, ok := t.held[reqID]
	if !ok || l.pending != 0 {
		return t.notHeld(reqID, now)
	}
	t.release(reqID, l, ReleasedDone, now)
	return nil
}

// evict releases the oldest fixed holds not being read until at least want
// blocks are queued for release (or none is left), and returns how many
// blocks it released.
func (t *leaseTable) evict(want int, now time.Time) int {
	var cands []string
	for id, l := range t.held {
		if l.fixed && l.pending == 0 && l.readers == 0 {
			cands = append(cands, id)
		}
	}
	slices.SortFunc(cands, func(a, b string) int { return t.held[a].since.Compare(t.held[b].since) })
	n := 0
	for _, id := range cands {
		if n >= want {
			break
		}
		l := t.held[id]
		n += len(l.blocks)
		t.release(id, l, ReleasedEvicted, now)
	}
	return n
}

// sweep expires every lease whose expiry is not after now, skipping leases
// with a READ in flight (they expire at the first sweep after the read
// ends). It walks the whole table: heartbeats make expiries unordered, so an
// early exit could strand blocks. It returns how many leases expired.
func (t *leaseTable) sweep(now time.Time) int {
	n := 0
	for id, l := range t.held {
		if l.pending == 0 && l.readers == 0 && !now.Before(l.expiry) {
			t.release(id, l, ReleasedExpired, now)
			n++
		}
	}
	t.pruneTombstones(now)
	return n
}

// beginRead validates a READ or SHM_READ of blocks of reqID and returns the
// generations the blocks had when the lease was taken. With pin, the lease
// cannot expire or be released until endRead. A lease whose expiry has
// passed is expired on the spot (expired reports it), even before the next
// sweep: its blocks may be about to be freed.
func (t *leaseTable) beginRead(reqID string, blocks []int, pin bool, now time.Time) (gens []uint64, expired bool, err error) {
	l, ok := t.held[reqID]
	if ok && l.pending == 0 && l.readers == 0 && !now.Before(l.expiry) {
		t.release(reqID, l, ReleasedExpired, now)
		expired = true
		ok = false
	}
	if !ok || l.pending != 0 || !now.Before(l.expiry) {
		return nil, expired, t.notHeld(reqID, now)
	}
	gens = make([]uint64, len(blocks))
	for i, b := range blocks {
		j, ok := l.index[b]
		if !ok {
			return nil, false, fmt.Errorf("block %d is not one of the %d blocks of request %q held by engine %s: %w (pass the remote_block_ids the prefill returned)", b, len(l.blocks), reqID, t.engineID, ErrBadBlock)
		}
		gens[i] = l.gens[j]
	}
	if pin {
		l.readers++
	}
	return gens, false, nil
}

// extend gives reqID another 2/3 lease if it is held (a shared-memory read
// counts as a heartbeat: the consumer is copying right now).
func (t *leaseTable) extend(reqID string, now time.Time) {
	t.heartbeat([]string{reqID}, now)
}

// endRead ends a pinned read started by beginRead.
func (t *leaseTable) endRead(reqID string, now time.Time) {
	l, ok := t.held[reqID]
	if !ok || l.readers == 0 {
		return
	}
	l.readers--
	if l.readers == 0 && l.pending != 0 {
		t.release(reqID, l, l.pending, now)
	}
}

func (t *leaseTable) release(id string, l *lease, why ReleaseReason, now time.Time) {
	if l.readers > 0 {
		l.pending = why
		return
	}
	delete(t.held, id)
	t.nblocks -= len(l.blocks)
	t.released = append(t.released, Release{RequestID: id, Blocks: l.blocks, Reason: why})
	at := now
	if why == ReleasedExpired {
		at = l.expiry
	}
	t.gone[id] = tombstone{reason: why, at: at}
	t.goneFIFO = append(t.goneFIFO, id)
	if len(t.goneFIFO) > maxTombstones {
		t.pruneTombstones(now)
	}
}

func (t *leaseTable) pruneTombstones(now time.Time) {
	drop := 0
	for ; drop < len(t.goneFIFO); drop++ {
		id := t.goneFIFO[drop]
		ts, ok := t.gone[id]
		over := len(t.goneFIFO)-drop > maxTombstones
		if ok && !over && now.Sub(ts.at) < tombstoneTTL {
			break
		}
		if ok {
			delete(t.gone, id)
		}
	}
	t.goneFIFO = slices.Delete(t.goneFIFO, 0, drop)
}

// takeReleased returns and forgets the releases since the last call.
func (t *leaseTable) takeReleased() []Release {
	r := t.released
	t.released = nil
	return r
}

// notHeld builds the error for an operation on a request the table does
// not hold, saying what happened to it.
func (t *leaseTable) notHeld(reqID string, now time.Time) error {
	if l, ok := t.held[reqID]; ok && l.pending != 0 {
		return fmt.Errorf("request %q is not held by engine %s: it is being released (%s): %w", reqID, t.engineID, l.pending, ErrNotHeld)
	}
	ts, ok := t.gone[reqID]
	switch {
	case ok && ts.reason == ReleasedExpired:
		ago := now.Sub(ts.at).Truncate(100 * time.Millisecond).Seconds()
		return fmt.Errorf("request %q is not held by engine %s: its lease expired %.1f s ago (raise --kv-lease or check that the decode engine heartbeats): %w", reqID, t.engineID, ago, ErrNotHeld)
	case ok:
		return fmt.Errorf("request %q is not held by engine %s: it was already released (DONE received): %w", reqID, t.engineID, ErrNotHeld)
	}
	return fmt.Errorf("request %q is not held by engine %s: unknown request (never held here, or released more than %v ago): %w", reqID, t.engineID, tombstoneTTL, ErrNotHeld)
}
