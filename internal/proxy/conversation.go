package proxy

import (
	"bytes"
	"container/list"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/tandem-serve/tandem/internal/apierror"
	"github.com/tandem-serve/tandem/internal/kvparams"
)

// Conversation mode (Config.Conversations) lets a decode engine started with
// --kv-bidirectional keep a conversation's KV after a turn and a prefill
// engine pull it back on the next turn (docs/kv-transfer.md, "The next turn
// (bidirectional)"). The proxy's part is a memory: per conversation, the
// kv_transfer_params the decode returned at the end of the last turn and
// the decode backend that returned them.

// conversationIDKey is the body field naming a conversation, as in vLLM's
// multi-turn example proxy (disagg_proxy_multiturn.py). Engines never see
// it: the proxy removes it from every leg.
const conversationIDKey = "conversation_id"

// HeaderConversationID names a conversation for clients that cannot add a
// body field. A body conversation_id must agree with it.
const HeaderConversationID = "X-Conversation-Id"

// maxConversationIDLen caps a conversation id, as request ids are capped.
const maxConversationIDLen = apierror.MaxRequestIDLen

// maxConversationTTL caps how long an entry is kept whatever expiry time
// the decode announced: a far-future or garbage value must not pin an entry.
const maxConversationTTL = 24 * time.Hour

// Labels of the conversation metrics.
const (
	convHit             = "hit"
	convMiss            = "miss"
	evictCapacity       = "capacity" // the least recently used entry made room
	evictExpired        = "expired"  // the decode's hold had ended (or the default TTL passed)
	evictReplaced       = "replaced" // a newer turn of the conversation stored its params first
	affinitySame        = "same_decode"
	affinityUnhealthy   = "decode_unhealthy" // the decode holding the history failed its health check
	defaultConvMaxItems = 10000
	defaultConvTTL      = 480 * time.Second // vLLM's decoder_kv_blocks_ttl
)

var (
	convLookupResults = []string{convHit, convMiss}
	convEvictReasons  = []string{evictCapacity, evictExpired, evictReplaced}
	convAffinity      = []string{affinitySame, affinityUnhealthy}
)

// conversationID returns the conversation a request names: the body's
// conversation_id (a non-empty JSON string; null or "" mean none) or the
// X-Conversation-Id header. Both may be given only if they agree.
func conversationID(obj *object, h http.Header) (string, *apierror.Error) {
	hdr := h.Get(HeaderConversationID)
	var body string
	if raw := bytes.TrimSpace(obj.getFolded(conversationIDKey)); len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
		if err := json.Unmarshal(raw, &body); err != nil {
			return "", apierror.BadRequest(conversationIDKey, "conversation_id must be a string")
		}
	}
	if len(body) > maxConversationIDLen || len(hdr) > maxConversationIDLen {
		return "", apierror.BadRequest(conversationIDKey, "conversation_id is longer than %d bytes", maxConversationIDLen)
	}
	if body != "" && hdr != "" && body != hdr {
		return "", apierror.BadRequest(conversationIDKey, "conversation_id and the %s header name different conversations; give one", HeaderConversationID)
	}
	if body != "" {
		return body, nil
	}
	return hdr, nil
}

// conversation is what the proxy remembers of one conversation's last turn.
type conversation struct {
	id      string          // "" for a turn remembered by its history (a request naming no conversation)
	params  json.RawMessage // the decode's kv_transfer_params, verbatim
	decode  *backend        // the decode engine that holds the history
	expires time.Time
	// history is, for a turn remembered by its history, the chained hashes
	// of the held history's whole blocks (prompt and answer, at most
	// maxHistoryBlocks) as the router hashes prompts; put indexes it and
	// drops it.
	history []uint64
	// matched is, for a turn found by its history, how many leading blocks
	// of the prompt matched it (at least; see indexedBlock), and full
	// whether the prompt has all of the history's blocks.
	matched int
	full    bool
}

// Automatic matching by prompt prefix: the bounds of the block index.
const (
	// maxHistoryBlocks bounds the blocks of a history that are matched
	// (32k tokens of 16): a longer history is matched by its first ones.
	maxHistoryBlocks = 2048
	// denseBlocks of a history are indexed one by one; beyond, every
	// sparseStride-th block and the last, so a prompt that leaves a long
	// history past its first denseBlocks matches it up to sparseStride−1
	// blocks short, at a fraction of the memory.
	denseBlocks  = 32
	sparseStride = 8
)

// indexedBlock reports whether block i of a history of n blocks is in the
// index.
func indexedBlock(i, n int) bool {
	return i < denseBlocks || i%sparseStride == sparseStride-1 || i == n-1
}

// convEntry is one remembered turn in the LRU, with its place in the block
// index when it was remembered by its history.
type convEntry struct {
	cv  conversation
	lru *list.Element
	// By history: the index elements of its indexed blocks (keys[i] is the
	// block hash of index[i]), the hash of its last block and its length in
	// blocks; truncated when it had more than maxHistoryBlocks.
	index     []*list.Element
	keys      []uint64
	end       uint64
	blocks    int
	truncated bool
}

// blockRef is one entry of the block index: a history whose block pos has
// the key's hash.
type blockRef struct {
	e   *convEntry
	pos int
}

// conversations is a bounded LRU of the decode params of finished turns:
// by conversation id, or — for requests naming no conversation — by the
// chained block hashes of their history, matched against later prompts
// (longest match first). It reads no clock: callers pass now, so tests step
// time by hand. Safe for concurrent use.
type conversations struct {
	max     int
	ttl     time.Duration                        // when the params carry no expiry time
	onEvict func(reason string, cv conversation) // called with mu held; must not block

	mu    sync.Mutex
	ll    *list.List // of *convEntry; front: most recently stored or looked up
	items map[string]*convEntry
	// byBlock lists, per block hash, the histories having it at an indexed
	// position, newest first; byEnd, per hash, the histories ending with it.
	byBlock map[uint64]*list.List
	byEnd   map[uint64][]*convEntry
}

func newConversations(max int, ttl time.Duration, onEvict func(reason string, cv conversation)) *conversations {
	if onEvict == nil {
		onEvict = func(string, conversation) {}
	}
	return &conversations{max: max, ttl: ttl, onEvict: onEvict, ll: list.New(), items: map[string]*convEntry{},
		byBlock: map[uint64]*list.List{}, byEnd: map[uint64][]*convEntry{}}
}

// take removes and returns id's entry. Params name blocks a prefill
// consumes on the next turn (the decode frees them on the prefill's DONE),
// so they are used once; the turn's own decode answer stores new ones. An
// expired entry is dropped, counted and reported as absent.
func (c *conversations) take(id string, now time.Time) (conversation, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[id]
	if !ok {
		return conversation{}, false
	}
	cv := c.remove(e)
	if !now.Before(cv.expires) {
		c.onEvict(evictExpired, cv)
		return conversation{}, false
	}
	return cv, true
}

// match removes and returns the remembered history that shares the most
// leading blocks with prompt (the chained block hashes of a prompt naming
// no conversation), if it shares at least minBlocks; among histories
// matching as deep, the newest. Expired ones met on the way are dropped.
func (c *conversations) match(prompt []uint64, minBlocks int, now time.Time) (conversation, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := min(len(prompt), maxHistoryBlocks) - 1; i >= max(minBlocks, 1)-1; i-- {
		l := c.byBlock[prompt[i]]
		if l == nil {
			continue
		}
		for el := l.Front(); el != nil; {
			ref := el.Value.(blockRef)
			el = el.Next()
			if ref.pos != i {
				continue // the same hash at another depth: a collision
			}
			cv := c.remove(ref.e)
			if !now.Before(cv.expires) {
				c.onEvict(evictExpired, cv)
				if c.byBlock[prompt[i]] != l {
					break // the list emptied and was dropped
				}
				continue
			}
			cv.matched, cv.full = i+1, i+1 == ref.e.blocks && !ref.e.truncated
			return cv, true
		}
	}
	return conversation{}, false
}

// put stores a turn's params: under its conversation id, replacing an older
// entry (two turns of one conversation ran at once), or under its history,
// superseding remembered histories it extends (or repeats), which no
// lookup would pick over it. Then it drops expired entries from the LRU end
// and the least recently used ones beyond max.
func (c *conversations) put(cv conversation, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := &convEntry{cv: cv}
	if cv.id != "" {
		if old, ok := c.items[cv.id]; ok {
			c.onEvict(evictReplaced, c.remove(old))
		}
		c.items[cv.id] = e
	} else {
		c.supersede(cv.history)
		c.index(e)
	}
	e.lru = c.ll.PushFront(e)
	for b := c.ll.Back(); b != nil; b = c.ll.Back() {
		old := b.Value.(*convEntry)
		switch {
		case !now.Before(old.cv.expires):
			c.onEvict(evictExpired, c.remove(old))
		case c.ll.Len() > c.max:
			c.onEvict(evictCapacity, c.remove(old))
		default:
			return
		}
	}
}

// supersede drops the remembered histories whose every block starts
// history.
func (c *conversations) supersede(history []uint64) {
	for i, h := range history {
		for _, o := range slices.Clone(c.byEnd[h]) {
			if o.blocks == i+1 && !o.truncated {
				c.onEvict(evictReplaced, c.remove(o))
			}
		}
	}
}

// index enters e's history into the block index.
func (c *conversations) index(e *convEntry) {
	h := e.cv.history
	if len(h) > maxHistoryBlocks {
		h, e.truncated = h[:maxHistoryBlocks], true
	}
	e.blocks, e.end = len(h), h[len(h)-1]
	for i, key := range h {
		if !indexedBlock(i, len(h)) {
			continue
		}
		l := c.byBlock[key]
		if l == nil {
			l = list.New()
			c.byBlock[key] = l
		}
		e.index = append(e.index, l.PushFront(blockRef{e: e, pos: i}))
		e.keys = append(e.keys, key)
	}
	c.byEnd[e.end] = append(c.byEnd[e.end], e)
	e.cv.history = nil
}

// drain removes and returns every entry (the proxy is stopping).
func (c *conversations) drain() []conversation {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []conversation
	for b := c.ll.Back(); b != nil; b = c.ll.Back() {
		out = append(out, c.remove(b.Value.(*convEntry)))
	}
	return out
}

// len returns the number of entries, expired ones not yet dropped included.
func (c *conversations) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len()
}

func (c *conversations) remove(e *convEntry) conversation {
	c.ll.Remove(e.lru)
	if e.cv.id != "" {
		delete(c.items, e.cv.id)
		return e.cv
	}
	for i, el := range e.index {
		l := c.byBlock[e.keys[i]]
		l.Remove(el)
		if l.Len() == 0 {
			delete(c.byBlock, e.keys[i])
		}
	}
	e.index, e.keys = nil, nil
	ends := slices.DeleteFunc(c.byEnd[e.end], func(o *convEntry) bool { return o == e })
	if len(ends) == 0 {
		delete(c.byEnd, e.end)
	} else {
		c.byEnd[e.end] = ends
	}
	return e.cv
}

// expiry is when a decode's held history ends: the params'
// remote_blocks_expiry_time when it is in Unix seconds (a Tandem decode's),
// or now + ttl when it is missing, not a number, or a vLLM decode's
// perf_counter deadline (kvparams.UnixExpiry: the proxy cannot read that
// clock, and such a decode set its deadline its own TTL after it answered,
// which is now); never later than now + maxConversationTTL. The prefill
// engine applies its own safety margin before pulling; the proxy only stops
// offering params that can no longer work.
func expiry(params json.RawMessage, now time.Time, ttl time.Duration) time.Time {
	p, err := kvparams.Parse(params)
	if err != nil {
		return now.Add(ttl)
	}
	t, ok := p.UnixExpiry()
	if !ok {
		return now.Add(ttl)
	}
	if limit := now.Add(maxConversationTTL); t.After(limit) {
		return limit
	}
	return t
}
