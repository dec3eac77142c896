package proxy

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

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

// lookUpTurn returns, and forgets, the history a request continues: its
// named conversation's last turn, or, for a request naming none, the
// remembered history its prompt starts with (nil for none).
func (p *Proxy) lookUpTurn(conv string, preq *router.Request) *conversation {
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

// newCapture returns the capture of a decode's 200 answer in conversation
// mode (nil otherwise); it collects the answer's text too when the turn is
// to be remembered by its history.
func (p *Proxy) newCapture(leg *decodeLeg, contentType string) *kvCapture {
	if p.convs == nil {
		return nil
	}
	c := newKVCapture(contentType)
	c.wantAnswer = leg.turn != nil
	return c
}

// keepTurn does what conversation mode does with the params a decode
// returned at the end of a turn the client got whole (delivered): keep them
// for the named conversation's next turn, or by the turn's history;
// otherwise, or when the client did not get it all, the hold is released
// at once.
func (p *Proxy) keepTurn(leg *decodeLeg, c *kvCapture, b *backend, id string, delivered bool) {
	c.kept = true
	switch {
	case !delivered:
	case leg.conv != "":
		p.remember(leg.conv, c.params, b)
		return
	case leg.turn != nil && c.answerOK():
		if p.rememberHistory(leg.turn, string(c.answer), c.params, b) {
			return
		}
	}
	p.releaseKV(&heldKV{engine: b, params: c.params}, id, releaseNoConversation)
}

// releaseUnkept releases the hold a decode's answer named when the relay
// ended before keepTurn saw it: the client left, or the answer was cut,
// after the chunk with the params.
func (p *Proxy) releaseUnkept(c *kvCapture, b *backend, id string) {
	if c.params != nil && !c.kept {
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
