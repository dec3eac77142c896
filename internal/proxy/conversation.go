package proxy

import (
	"bytes"
	"container/list"
	"encoding/json"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/tandem-serve/tandem/internal/apierror"
)

// Conversation mode (Config.Conversations) lets a decode engine started with
// --kv-bidirectional keep a conversation's KV after a turn and a prefill
// engine pull it back on the next turn (vllm-pd.md §1.5). The proxy's part
// is a memory: per conversation, the kv_transfer_params the decode returned
// at the end of the last turn and the decode backend that returned them.

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
	id      string
	params  json.RawMessage // the decode's kv_transfer_params, verbatim
	decode  *backend        // the decode engine that holds the history
	expires time.Time
}

// conversations is a bounded LRU map from conversation id to its last
// turn's decode params. It reads no clock: callers pass now, so tests step
// time by hand. Safe for concurrent use.
type conversations struct {
	max     int
	ttl     time.Duration                        // when the params carry no expiry time
	onEvict func(reason string, cv conversation) // called with mu held; must not block

	mu    sync.Mutex
	ll    *list.List // front: most recently stored or looked up
	items map[string]*list.Element
}

func newConversations(max int, ttl time.Duration, onEvict func(reason string, cv conversation)) *conversations {
	if onEvict == nil {
		onEvict = func(string, conversation) {}
	}
	return &conversations{max: max, ttl: ttl, onEvict: onEvict, ll: list.New(), items: map[string]*list.Element{}}
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

// put stores the params of id's latest turn, replacing an older entry (two
// turns of one conversation ran at once), then drops expired entries from
// the LRU end and the least recently used ones beyond max.
func (c *conversations) put(cv conversation, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[cv.id]; ok {
		c.onEvict(evictReplaced, c.remove(e))
	}
	c.items[cv.id] = c.ll.PushFront(cv)
	for e := c.ll.Back(); e != nil; e = c.ll.Back() {
		old := e.Value.(conversation)
		switch {
		case !now.Before(old.expires):
			c.onEvict(evictExpired, c.remove(e))
		case c.ll.Len() > c.max:
			c.onEvict(evictCapacity, c.remove(e))
		default:
			return
		}
	}
}

// len returns the number of entries, expired ones not yet dropped included.
func (c *conversations) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len()
}

func (c *conversations) remove(e *list.Element) conversation {
	cv := c.ll.Remove(e).(conversation)
	delete(c.items, cv.id)
	return cv
}

// expiry is when a decode's held history ends: the params'
// remote_blocks_expiry_time (Unix seconds, a float), or now + ttl when it is
// missing or not a number; never later than now + maxConversationTTL. The
// prefill engine applies its own safety margin before pulling; the proxy
// only stops offering params that can no longer work.
func expiry(params json.RawMessage, now time.Time, ttl time.Duration) time.Time {
	var p struct {
		Expiry *float64 `json:"remote_blocks_expiry_time"`
	}
	if err := json.Unmarshal(params, &p); err != nil || p.Expiry == nil || math.IsNaN(*p.Expiry) || math.IsInf(*p.Expiry, 0) {
		return now.Add(ttl)
	}
	limit := now.Add(maxConversationTTL)
	if *p.Expiry >= float64(limit.Unix()) {
		return limit
	}
	sec, frac := math.Modf(*p.Expiry)
	return time.Unix(int64(sec), int64(frac*1e9))
}
