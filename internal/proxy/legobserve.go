package proxy

import (
	"encoding/json"
	"net/http"

	"github.com/tandem-serve/tandem/internal/router"
)

// uncachedTokens is the proxy's own estimate of the prompt tokens engine
// base computes for preq: the prompt less the blocks it is known to hold.
func uncachedTokens(preq *router.Request, base string) int {
	return max(preq.PromptTokens-preq.PrefixHits[base]*preq.BlockSize, 0)
}

// answerUsage is the part of an answer's usage the leg costs read.
type answerUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	Details      *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// computedTokens is the prompt tokens an engine computed for a whole JSON
// answer: its usage's prompt_tokens less prompt_tokens_details.
// cached_tokens (a Tandem engine counts there both its prefix cache hits
// and the tokens whose KV it pulled). ok is false when the answer has no
// usage with prompt tokens; an engine that reports no details (vLLM without
// --enable-prompt-tokens-details) counts every prompt token as computed.
func computedTokens(data []byte) (n int, ok bool) {
	if !json.Valid(data) {
		return 0, false
	}
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return 0, false
	}
	var u answerUsage
	_ = eachField(data, i, func(rawKey, val []byte) error {
		if isKey(rawKey, "usage") {
			u = answerUsage{}
			ok = json.Unmarshal(val, &u) == nil && u.PromptTokens > 0
		}
		return nil
	})
	if !ok {
		return 0, false
	}
	if u.Details != nil {
		return max(u.PromptTokens-u.Details.CachedTokens, 0), true
	}
	return u.PromptTokens, true
}

// observePrefillAnswer records a prefill leg's 2xx answer from b: its
// Server-Timing, and the tokens its usage says were computed (else the
// proxy's estimate, estimate).
func (p *Proxy) observePrefillAnswer(b *backend, resp *http.Response, data []byte, estimate int) {
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return
	}
	t := parseEngineTiming(resp.Header)
	if !t.ok {
		return
	}
	n, ok := computedTokens(data)
	if !ok {
		n = estimate
	}
	p.observePrefillLeg(b.base, n, t.prefill, t.queue, false)
}

// observeDecodeAnswer records a decode attempt's 200 answer, whose prompt
// has uncached tokens not in the decode's cache by the proxy's estimate:
// for a local prefill (remote false) the prefill it computed, of uncached
// tokens unless the answer came whole in its first read and its usage
// says; for a remote leg the decode leg's own costs (observeDecodeLeg).
func (p *Proxy) observeDecodeAnswer(a *decodeAttempt, remote bool, uncached int) {
	if a.resp == nil || a.resp.StatusCode != http.StatusOK {
		return
	}
	t := parseEngineTiming(a.resp.Header)
	if !t.ok {
		return
	}
	if remote {
		p.observeDecodeLeg(a.b.base, uncached, t.queue, t.pull, t.ready+t.prefill)
		return
	}
	local := uncached
	if a.buf != nil && a.n > 0 {
		if n, ok := computedTokens((*a.buf)[:a.n]); ok {
			local = n
		}
	}
	p.observePrefillLeg(a.b.base, local, t.prefill, t.queue, true)
}
