package proxy

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"

	"github.com/tandem-serve/tandem/internal/apierror"
	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// convTurn is conversation mode's part in one request. The request flow
// (flow.go, decode.go, relay.go) calls it at fixed points and knows nothing
// of histories: which history the turn continues and which decode holds it
// (lookUp), what the prefill leg carries (prefill), and what is kept of the
// decode's answer for the next turn (newCapture, afterDecode). With
// conversation mode off it does nothing: no history, no capture.
type convTurn struct {
	p       *Proxy
	conv    string        // the conversation the request names, if any
	history *conversation // what the turn continues; nil for none
	// byHistory is the turn to remember by its history once its decode
	// answered: a request naming no conversation whose prompt went to the
	// prefill leg (a local prefill's turn is not remembered by its history).
	byHistory *historyTurn
}

// newTurn starts the request's turn. In conversation mode it takes the
// conversation id out of the request (the body field or the header; engines
// never see it) and returns the body without it.
func (p *Proxy) newTurn(h http.Header, body []byte, obj *object) (*convTurn, []byte, *object, *apierror.Error) {
	t := &convTurn{p: p}
	if p.convs == nil {
		return t, body, obj, nil
	}
	conv, aerr := conversationID(obj, h)
	if aerr != nil {
		return nil, nil, nil, aerr
	}
	t.conv = conv
	obj, body = withoutConversationID(body, obj)
	return t, body, obj, nil
}

// lookUp takes the history the turn continues (its named conversation's
// last turn, or a remembered history its prompt starts with) and returns
// the decode the turn should go to: the one that answered the last turn,
// whose prefix cache holds the history, while it is healthy; nil lets the
// policy pick.
func (t *convTurn) lookUp(preq *router.Request) *backend {
	if t.p.convs == nil {
		return nil
	}
	t.history = t.p.lookUpHistory(t.conv, preq)
	return t.p.affinity(t.history)
}

// drop releases the history's hold on its decode when the turn ends before
// its prefill leg: no decode could take it.
func (t *convTurn) drop(id string) {
	if t.history != nil {
		t.p.releaseKV(&heldKV{engine: t.history.decode, params: t.history.params}, id, releaseHistoryUnused)
	}
}

// decision is the disaggregation decision for a turn that continues a
// history: remote, as only a prefill leg can pull the history's KV; false
// when the decider is to decide.
func (t *convTurn) decision() (router.Decision, bool) {
	if t.history == nil {
		return router.Decision{}, false
	}
	return router.Decision{Remote: true, Reason: "conversation"}, true
}

// prefill runs the turn's prefill leg. Without history it is the plain leg,
// retried on other prefill engines. With history the leg carries the params
// of the history's decode in place of the proxy's request, so that the
// prefill pulls the history's KV; if it fails in any way but the client
// leaving (stale history: expired, the decode restarted, a client that
// rewrote it), the turn costs a recompute, never an error: the plain leg
// follows, and the history's hold is released.
func (t *convTurn) prefill(r *http.Request, id string, obj *object, preq *router.Request) prefillResult {
	p := t.p
	t.byHistory = p.historyTurnOf(t.conv, obj, preq)
	if t.history == nil {
		return p.prefillWithRetries(r, id, obj, preq, prefillKVParams)
	}
	p.metrics.historyPrefills.Inc()
	res := p.runPrefill(r, id, obj, preq, t.history.params, time.Now().Add(p.cfg.Timeout))
	reason, retry := res.retryable()
	if !retry {
		return res
	}
	p.metrics.prefillRetries.WithLabelValues(reason).Inc()
	p.log.Info("prefill leg with the conversation's history failed; retrying without it",
		"request_id", id, "reason", reason, "detail", res.detail, "history_decode", t.history.decode.base)
	res = p.prefillWithRetries(r, id, obj, preq, prefillKVParams)
	p.releaseKV(&heldKV{engine: t.history.decode, params: t.history.params}, id, releaseHistoryUnused)
	return res
}

// newCapture returns the capture of the decode's answer in conversation
// mode, for a 200 (nil otherwise); it collects the answer's text too when
// the turn is to be remembered by its history.
func (t *convTurn) newCapture(resp *http.Response) *kvCapture {
	if t.p.convs == nil || resp.StatusCode != http.StatusOK {
		return nil
	}
	c := newKVCapture(resp.Header.Get("Content-Type"))
	c.wantAnswer = t.byHistory != nil
	return c
}

// afterDecode ends conversation mode's part of a whole answer: it relays
// (with send) what the capture c still holds, and keeps the decode's params
// only when the client got the answer all. It reports whether the client
// did; a nil c (no capture) has nothing to do.
func (t *convTurn) afterDecode(c *kvCapture, b *backend, id string, send func([]byte) error) bool {
	if c == nil {
		return true
	}
	err := send(c.finish())
	if c.params != nil {
		t.keep(c, b, id, err == nil)
	}
	return err == nil
}

// keep does what conversation mode does with the params a decode returned
// at the end of a turn the client got whole (delivered): keep them for the
// named conversation's next turn, or by the turn's history; otherwise, or
// when the client did not get it all, the hold is released at once.
func (t *convTurn) keep(c *kvCapture, b *backend, id string, delivered bool) {
	p := t.p
	c.kept = true
	switch {
	case !delivered:
	case t.conv != "":
		p.remember(t.conv, c.params, b)
		return
	case t.byHistory != nil && c.answerOK():
		if p.rememberHistory(t.byHistory, string(c.answer), c.params, b) {
			return
		}
	}
	p.releaseKV(&heldKV{engine: b, params: c.params}, id, releaseNoConversation)
}

// lookUpConversation returns, and forgets, what the last turn of conv left
// (nil for none: no conversation mode, no id, or a miss).
func (p *Proxy) lookUpConversation(conv string) *conversation {
	if conv == "" {
		return nil
	}
	cv, ok := p.convs.take(conv, p.now())
	if !ok {
		p.metrics.convLookups.WithLabelValues(convMiss).Inc()
		return nil
	}
	p.metrics.convLookups.WithLabelValues(convHit).Inc()
	return &cv
}

// affinity is the decode backend a conversation's turn should go to: the
// one that answered its last turn, whose prefix cache holds the history,
// while it is healthy; nil lets the policy pick.
func (p *Proxy) affinity(history *conversation) *backend {
	if history == nil {
		return nil
	}
	if !history.decode.healthy.Load() {
		p.metrics.decodeAffinity.WithLabelValues(affinityUnhealthy).Inc()
		return nil
	}
	p.metrics.decodeAffinity.WithLabelValues(affinitySame).Inc()
	return history.decode
}

// forget counts a conversation the proxy drops before a turn used it, and
// releases the decode's hold unless it has ended anyway.
func (p *Proxy) forget(reason string, cv conversation) {
	p.metrics.convEvictions.WithLabelValues(reason).Inc()
	if reason != evictExpired {
		p.releaseKV(&heldKV{engine: cv.decode, params: cv.params}, "", releaseConvEvicted)
	}
}

// remember keeps the params a decode returned at the end of conv's turn.
func (p *Proxy) remember(conv string, params json.RawMessage, decode *backend) {
	now := p.now()
	exp := expiry(params, now, p.cfg.ConversationTTL)
	if !now.Before(exp) {
		// Already over (or the proxy's clock is far ahead of the decode's): no next turn
		// could use it.
		p.log.Debug("decode returned kv_transfer_params that have already expired; not kept", "backend", decode.base, "expired", exp)
		return
	}
	p.convs.put(conversation{id: conv, params: params, decode: decode, expires: exp}, now)
	p.metrics.convStored.Inc()
}

// Automatic matching by prompt prefix (conversation mode with the model's
// tokenizer, Config.Tokenizer): a turn that names no conversation is
// remembered by the chained block hashes of its history — its prompt and
// answer, tokenized as the next turn's prompt will be, cut to the
// remote_num_tokens whose KV the decode holds — and a later request naming
// no conversation whose prompt starts with at least
// Config.ConversationMinPrefixTokens of a remembered history (whole blocks;
// the longest match wins, the newest among equals) gets its params as its
// prefill leg's history, as a named conversation's next turn would. The
// proxy's match only picks the params: the prefill checks the history's
// hash chain against its own prompt and pulls only what agrees.

// Results of a lookup by prompt prefix, the result label of
// tandem:proxy_conversation_prefix_lookups_total.
const (
	prefixHit     = "hit"     // the prompt has every block of the history
	prefixPartial = "partial" // it leaves the history after its first blocks (an edited history, or a prefix another conversation shares)
	prefixMiss    = convMiss
)

var prefixLookupResults = []string{prefixHit, prefixPartial, prefixMiss}

// defaultMinPrefixTokens is Config.ConversationMinPrefixTokens' default:
// the engines' default --kv-recompute-threshold, below which a prefill
// computes a history instead of pulling it.
const defaultMinPrefixTokens = 64

// releaseProxyStopped labels the holds a stopping proxy gives back: no
// other proxy has their params.
const releaseProxyStopped = "proxy_stopped"

// initConversations starts conversation mode: the memory, its metrics, and
// automatic matching when the router counts tokens exactly.
func (p *Proxy) initConversations() {
	p.convs = newConversations(p.cfg.ConversationMaxEntries, p.cfg.ConversationTTL, p.forget)
	p.metrics.watchConversations(p.convs)
	if p.cfg.Tokenizer == nil {
		p.log.Info("conversation mode: automatic matching by prompt prefix is off (it needs exact token counts: give --model DIR); requests naming no conversation have their decode's KV hold released at once")
		return
	}
	p.matchHistories = true
	p.log.Info("conversation mode: requests naming no conversation are matched by prompt prefix",
		"min_prefix_tokens", p.cfg.ConversationMinPrefixTokens, "block_size", p.cfg.BlockSize)
}

// minPrefixBlocks is the least number of whole blocks a prompt must share
// with a remembered history to use it.
func (p *Proxy) minPrefixBlocks() int {
	bs := p.cfg.BlockSize
	return max(1, (p.cfg.ConversationMinPrefixTokens+bs-1)/bs)
}

// lookUpHistory returns, and forgets, the history a request continues: its
// named conversation's last turn, or, for a request naming none, the
// remembered history its prompt starts with (nil for none).
func (p *Proxy) lookUpHistory(conv string, preq *router.Request) *conversation {
	if conv != "" || !p.matchHistories || !preq.Exact {
		return p.lookUpConversation(conv)
	}
	cv, ok := p.convs.match(preq.BlockHashes, p.minPrefixBlocks(), p.now())
	if !ok {
		p.metrics.prefixLookups.WithLabelValues(prefixMiss).Inc()
		return nil
	}
	result := prefixPartial
	if cv.full {
		result = prefixHit
	}
	p.metrics.prefixLookups.WithLabelValues(result).Inc()
	p.log.Debug("request matched a remembered history by its prompt", "request_id", preq.ID, "result", result,
		"matched_blocks", cv.matched, "prompt_blocks", len(preq.BlockHashes), "history_decode", cv.decode.base)
	return &cv
}

// historyTurn is what a request naming no conversation needs to be
// remembered by its history once its decode answered: its prompt (a
// completion's) or messages (a chat's), rendered as the router renders
// prompts.
type historyTurn struct {
	chat     bool
	prompt   string
	messages []tokenizer.Message
}

// historyTurnOf returns the turn to remember by its history, or nil when
// the request's turn is not remembered that way: it names a conversation,
// matching is off, the router cannot tokenize its prompt, or its answer is
// not one continuation of the prompt (n or best_of above 1, echo, suffix).
func (p *Proxy) historyTurnOf(conv string, obj *object, preq *router.Request) *historyTurn {
	if conv != "" || !p.matchHistories || !preq.Exact {
		return nil
	}
	for _, k := range []string{"n", "best_of"} {
		if v := bytes.TrimSpace(obj.getFolded(k)); len(v) > 0 && !bytes.Equal(v, []byte("1")) && !bytes.Equal(v, []byte("null")) {
			return nil
		}
	}
	if v := bytes.TrimSpace(obj.getFolded("echo")); bytes.Equal(v, []byte("true")) {
		return nil
	}
	if v := bytes.TrimSpace(obj.getFolded("suffix")); len(v) > 0 && !bytes.Equal(v, []byte("null")) {
		return nil
	}
	if msgs := obj.getFolded("messages"); len(msgs) > 0 {
		t := &historyTurn{chat: true}
		if json.Unmarshal(msgs, &t.messages) != nil {
			return nil
		}
		return t
	}
	t := &historyTurn{}
	if json.Unmarshal(obj.getFolded("prompt"), &t.prompt) != nil {
		return nil
	}
	return t
}

// historyTokens tokenizes a finished turn's history as the next turn's
// prompt will be: the completion's prompt followed by its answer, or the
// chat's messages followed by the answer as an assistant message.
func (p *Proxy) historyTokens(t *historyTurn, answer string) ([]int32, bool) {
	tok := p.cfg.Tokenizer
	if !t.chat {
		return tok.Encode(t.prompt+answer, true), true
	}
	msgs := append(append([]tokenizer.Message(nil), t.messages...), tokenizer.Message{Role: "assistant", Content: answer})
	text, err := tok.ApplyChatTemplate(msgs, false)
	if err != nil {
		return nil, false
	}
	return tok.Encode(text, false), true
}

// rememberHistory keeps the params a decode returned at the end of a turn
// naming no conversation, under its history's block hashes. It reports
// false when the turn cannot be matched by a later prompt (a history
// shorter than the least match, an answer it could not read), so that the
// caller releases the hold.
func (p *Proxy) rememberHistory(t *historyTurn, answer string, params json.RawMessage, decode *backend) bool {
	var kv struct {
		NumTokens *float64 `json:"remote_num_tokens"`
	}
	if json.Unmarshal(params, &kv) != nil || kv.NumTokens == nil || *kv.NumTokens < 1 {
		return false
	}
	ids, ok := p.historyTokens(t, answer)
	if !ok {
		return false
	}
	ids = ids[:min(len(ids), int(min(*kv.NumTokens, 1<<30)))]
	if len(ids) > maxHistoryBlocks*p.cfg.BlockSize {
		ids = ids[:maxHistoryBlocks*p.cfg.BlockSize]
	}
	chain := p.hashBlocks(ids)
	if len(chain) < p.minPrefixBlocks() {
		return false
	}
	now := p.now()
	exp := expiry(params, now, p.cfg.ConversationTTL)
	if !now.Before(exp) {
		return false
	}
	p.convs.put(conversation{params: params, decode: decode, expires: exp, history: chain}, now)
	p.metrics.convStored.Inc()
	return true
}

// releaseUnkept releases the hold a decode's answer named when the relay
// ended before afterDecode saw it: the client left, or the answer was cut,
// after the chunk with the params. A nil capture (none) holds nothing.
func (p *Proxy) releaseUnkept(c *kvCapture, b *backend, id string) {
	if c != nil && c.params != nil && !c.kept {
		c.kept = true
		p.releaseKV(&heldKV{engine: b, params: c.params}, id, releaseNoConversation)
	}
}

// Bounds on giving back the remembered holds when the proxy stops.
const (
	stopReleaseConcurrency = 8
	stopReleaseBudget      = 5 * time.Second
)

// releaseConversations gives back, when the proxy stops, the decode holds
// of every turn it remembers (no other proxy has their params), a few at a
// time and for at most stopReleaseBudget; holds it could not release end
// at their expiry.
func (p *Proxy) releaseConversations() {
	if p.convs == nil {
		return
	}
	all := p.convs.drain()
	if len(all) == 0 {
		return
	}
	deadline := time.Now().Add(stopReleaseBudget)
	sem := make(chan struct{}, stopReleaseConcurrency)
	released := 0
	now := p.now()
	for _, cv := range all {
		if !now.Before(cv.expires) {
			continue
		}
		if time.Now().After(deadline) {
			break
		}
		sem <- struct{}{}
		released++
		p.bg.Go(func() {
			defer func() { <-sem }()
			result, _ := p.postRelease(&heldKV{engine: cv.decode, params: cv.params}, "")
			p.metrics.kvReleases.WithLabelValues(releaseProxyStopped, result).Inc()
		})
	}
	p.log.Info("proxy stopping: released the conversations' KV holds on the decodes", "released", released, "remembered", len(all))
}
