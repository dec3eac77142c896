package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/scorer/prefix"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// Approximate token counting, used while the router has no tokenizer: a
// token is about four bytes of English text, and a block of BlockSize tokens
// about 4·BlockSize bytes of the prompt.
const bytesPerToken = 4

// defaultMaxTokens is the output length assumed for accounting when a
// request does not say.
const defaultMaxTokens = 256

// routeRequest builds what the router's plugins see of a request: its token
// counts and the chained hashes of its prompt's blocks. With a tokenizer
// (Config.Tokenizer) they are exact: the prompt is tokenized, a chat's
// messages rendered with the model's template first, and blocks are
// BlockSize tokens as on the engines. Without one, or for prompts it cannot
// render (token-id prompts, multi-part contents), they are approximate.
func (p *Proxy) routeRequest(path, id string, body []byte, obj *object) *router.Request {
	// The fields as the engines' encoding/json reads them: names matched
	// case-insensitively, the last match winning.
	prompt, messages := obj.getFolded("prompt"), obj.getFolded("messages")
	req := &router.Request{Path: path, ID: id, Body: body, BlockSize: p.cfg.BlockSize, MaxTokens: defaultMaxTokens}
	if n, ok := intField(obj.getFolded("max_tokens")); ok {
		req.MaxTokens = n
	} else if n, ok := intField(obj.getFolded("max_completion_tokens")); ok {
		req.MaxTokens = n
	}
	if ids, ok := p.tokenize(prompt, messages); ok {
		req.Exact = true
		req.PromptTokens = len(ids)
		req.BlockHashes = p.hashBlocks(ids)
		return req
	}
	text := promptText(prompt, messages)
	req.PromptTokens = (len(text) + bytesPerToken - 1) / bytesPerToken
	blockBytes := p.cfg.BlockSize * bytesPerToken
	h := fnv.New64a()
	for off := 0; off+blockBytes <= len(text); off += blockBytes {
		// Chained: a block's hash covers every byte before it, as the
		// engines' block hashes cover every token before.
		_, _ = h.Write(text[off : off+blockBytes])
		req.BlockHashes = append(req.BlockHashes, h.Sum64())
	}
	return req
}

// intField reads an integer field's raw value; false when absent, null or
// not an integer (a body the engines will refuse anyway).
func intField(raw json.RawMessage) (int, bool) {
	if len(raw) == 0 {
		return 0, false
	}
	if n, err := strconv.Atoi(string(raw)); err == nil {
		return n, true
	}
	var n *int
	if json.Unmarshal(raw, &n) != nil || n == nil {
		return 0, false
	}
	return *n, true
}

// hashBlocks returns the chained hashes of the whole blocks of ids, as the
// engines hash them when the router follows their KV events
// (Config.BlockHasher), else FNV-1a over the token ids, each block's hash
// covering every token before it.
func (p *Proxy) hashBlocks(ids []int32) []uint64 {
	if p.cfg.BlockHasher != nil {
		return p.cfg.BlockHasher(ids)
	}
	var out []uint64
	h := fnv.New64a()
	var buf [4]byte
	for off := 0; off+p.cfg.BlockSize <= len(ids); off += p.cfg.BlockSize {
		for _, t := range ids[off : off+p.cfg.BlockSize] {
			buf[0], buf[1], buf[2], buf[3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
			_, _ = h.Write(buf[:])
		}
		out = append(out, h.Sum64())
	}
	return out
}

// tokenize returns the prompt's token ids as the engine computes them, when
// the router has the model's tokenizer and the prompt is a string or chat
// messages with string contents.
func (p *Proxy) tokenize(prompt, messages json.RawMessage) ([]int32, bool) {
	tok := p.cfg.Tokenizer
	if tok == nil {
		return nil, false
	}
	if len(messages) > 0 {
		var msgs []tokenizer.Message
		if json.Unmarshal(messages, &msgs) != nil || !tok.HasChatTemplate() {
			return nil, false
		}
		text, err := tok.ApplyChatTemplate(msgs, true)
		if err != nil {
			return nil, false
		}
		return tok.Encode(text, false), true
	}
	var s string
	if json.Unmarshal(prompt, &s) != nil {
		return nil, false
	}
	return tok.Encode(s, true), true
}

// promptText is the bytes the prompt is made of, in order: a completion's
// prompt (string or array) or a chat's messages, as the client sent them
// (JSON escapes included; equal prompts give equal bytes).
func promptText(prompt, messages json.RawMessage) []byte {
	if len(messages) > 0 {
		return messages
	}
	if n := len(prompt); n >= 2 && prompt[0] == '"' && bytes.IndexByte(prompt, '\\') < 0 {
		return prompt[1 : n-1] // a string without escapes is its bytes
	}
	var s string
	if json.Unmarshal(prompt, &s) == nil {
		return []byte(s)
	}
	return prompt
}

// tokens is what a request counts for in the load accounting.
func tokens(req *router.Request) int64 { return int64(req.PromptTokens + req.MaxTokens) }

// matchPrefix asks the prefix index how many leading blocks each decode
// holds, once per request: the answer is kept in req for its other picks
// (a retry on another decode) and its disaggregation decision.
func (p *Proxy) matchPrefix(req *router.Request) map[string]int {
	if req.PrefixHits != nil {
		return req.PrefixHits
	}
	hits := map[string]int{}
	var idx prefix.Index = p.prefix
	if p.cfg.PrefixIndex != nil {
		idx = p.cfg.PrefixIndex
	}
	idx.Match(req.BlockHashes, func(engine string, blocks int) { hits[engine] = blocks })
	req.PrefixHits = hits
	return hits
}

// errSaturated is returned by admit when every candidate stayed saturated.
var errSaturated = fmt.Errorf("every engine is saturated")

// admit picks a backend of pl for req, waiting in the bounded admission
// queue while every candidate is saturated. It returns nil, nil when no
// backend is healthy, and errSaturated when the wait timed out or the queue
// was full.
func (p *Proxy) admit(ctx context.Context, pl *pool, req *router.Request, exclude ...*backend) (*backend, func(), error) {
	b, release, sat := pl.pick(req, tokens(req), exclude...)
	if b != nil || !sat {
		return b, release, nil
	}
	select {
	case p.queued <- struct{}{}:
		defer func() { <-p.queued }()
	default:
		p.metrics.admission.WithLabelValues("rejected").Inc()
		return nil, nil, errSaturated
	}
	deadline := time.NewTimer(p.cfg.QueueTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-deadline.C:
			p.metrics.admission.WithLabelValues("rejected").Inc()
			return nil, nil, errSaturated
		case <-tick.C:
		}
		b, release, sat = pl.pick(req, tokens(req), exclude...)
		if b != nil || !sat {
			if b != nil {
				p.metrics.admission.WithLabelValues("admitted").Inc()
			}
			return b, release, nil
		}
	}
}

// writeSaturated answers 429 with Retry-After.
func (p *Proxy) writeSaturated(w http.ResponseWriter, role string) {
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusTooManyRequests,
		fmt.Sprintf("every %s engine is saturated and the admission queue is full or timed out (%v); retry later", role, p.cfg.QueueTimeout))
}

// runScrape scrapes every backend's /metrics every ScrapeInterval until ctx
// is done.
func (p *Proxy) runScrape(ctx context.Context) {
	t := time.NewTicker(p.cfg.ScrapeInterval)
	defer t.Stop()
	for {
		var wg sync.WaitGroup
		for _, pl := range []*pool{p.prefill, p.decode} {
			for _, b := range pl.list() {
				if b.healthy.Load() {
					wg.Go(func() { p.scrape(ctx, b) })
				}
			}
		}
		wg.Wait()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrape reads b's load (vllm:num_requests_waiting,
// vllm:num_requests_running, vllm:kv_cache_usage_perc) and the counters its
// costs are measured from (see costs).
func (p *Proxy) scrape(parent context.Context, b *backend) {
	ctx, cancel := context.WithTimeout(parent, p.cfg.ScrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.base+"/metrics", nil)
	if err != nil {
		return
	}
	setAuth(req.Header, p.cfg.BackendAPIKey)
	resp, err := p.client.Do(req)
	if err != nil {
		if parent.Err() == nil {
			p.metrics.scrapeFailures.WithLabelValues(b.role, b.base).Inc()
		}
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		p.metrics.scrapeFailures.WithLabelValues(b.role, b.base).Inc()
		return
	}
	s, ok := parseEngineMetrics(bufio.NewScanner(resp.Body))
	if !ok {
		p.metrics.scrapeFailures.WithLabelValues(b.role, b.base).Inc()
		return
	}
	b.mu.Lock()
	s.at = time.Now()
	b.waiting, b.running, b.kvUsage, b.scrapedAt = s.waiting, s.running, s.kvUsage, s.at
	b.inFlightAtScrape = b.inFlight.Load()
	b.costs.observe(s)
	c := b.costs
	b.mu.Unlock()
	p.observeScrape(b, s, c)
}

// parseEngineMetrics sums the load metrics and the cost counters over their
// label sets in Prometheus text format. ok is false unless at least one of
// the three load metrics was found.
func parseEngineMetrics(sc *bufio.Scanner) (s engineSample, ok bool) {
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || !(strings.HasPrefix(line, "vllm:") || strings.HasPrefix(line, "tandem:")) {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		labels := ""
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
			if j := strings.LastIndexByte(line, '}'); j >= 0 {
				labels, rest = line[i:j+1], strings.TrimSpace(line[j+1:])
			}
		}
		val, _, _ := strings.Cut(strings.TrimSpace(rest), " ")
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		switch name {
		case "vllm:num_requests_waiting":
			s.waiting += v
		case "vllm:num_requests_running":
			s.running += v
		case "vllm:kv_cache_usage_perc":
			s.kvUsage = max(s.kvUsage, v)
		default:
			s.addCounter(name, labels, v)
			continue
		}
		ok = true
	}
	return s, ok
}

// addCounter adds one sample of a cost counter to s; other names are
// ignored.
func (s *engineSample) addCounter(name, labels string, v float64) {
	switch name {
	case "vllm:time_to_first_token_seconds_sum":
		s.ttftSum += v
	case "vllm:time_to_first_token_seconds_count":
		s.ttftCount += v
	case "vllm:request_queue_time_seconds_sum":
		s.queueSum += v
	case "vllm:request_queue_time_seconds_count":
		s.queueCount += v
	case "vllm:inter_token_latency_seconds_sum":
		s.itlSum += v
	case "vllm:inter_token_latency_seconds_count":
		s.itlCount += v
	case "tandem:kv_transfer_seconds_sum":
		s.transferSum += v
	case "vllm:prompt_tokens_by_source":
		switch {
		case strings.Contains(labels, `source="local_compute"`):
			s.computed += v
		case strings.Contains(labels, `source="external_kv_transfer"`):
			s.pulled += v
		}
	case "tandem:engine_info": // the engine's internal/metrics.EngineInfoName
		s.info = parseEngineInfo(labels)
	}
}
