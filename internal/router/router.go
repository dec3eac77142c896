// Package router is the proxy's scheduling pipeline, in the llm-d router's
// shape without its framework: for one pool of engines, filters drop the
// endpoints that cannot take a request, weighted scorers rate the rest in
// [0,1], and a picker chooses one. A disaggregation decider then says whether
// the request's prompt is prefilled on a prefill engine (remote) or by the
// chosen decode itself (local). Each plugin lives in its own folder below
// this one (filter/, scorer/, picker/, decider/) and is made by name through
// package router/factory, so a policy is added without touching the request
// flow or the other policies.
//
// Plugins are pure: they read the Endpoint snapshots and the Request they
// are given and keep no I/O of their own. The proxy takes the snapshots
// (health, its own in-flight accounting, the engine metrics it scrapes, the
// prefix matches of the cache index) and acts on the answer.
package router

import (
	"errors"
	"fmt"
	"sync"
)

// Endpoint is one engine as the plugins see it: a snapshot taken just before
// the pipeline runs. Plugins must not keep pointers into it.
type Endpoint struct {
	// Index is the backend's id in the proxy, stable for its lifetime, so a
	// plugin may keep per-backend state keyed by it.
	Index int
	// URL is the engine's base URL and Host its host (for locality).
	URL, Host string
	// Role is "prefill" or "decode".
	Role string
	// Healthy is the last health check's result (and the circuit breaker's).
	Healthy bool
	// InFlight and InFlightTokens are the router's own accounting: requests
	// it has open on the engine and their tokens (prompt + expected output),
	// updated when a request is dispatched and when it finishes.
	InFlight, InFlightTokens int64
	// LocalPrefillTokens is the router's count of the prompt tokens a
	// decode engine has still to prefill itself: the uncached tokens of the
	// local prefills sent to it and not yet answered (their first byte).
	LocalPrefillTokens int64
	// Scraped says whether Waiting, Running and KVUsage are fresh values of
	// the engine's vllm:num_requests_waiting, vllm:num_requests_running and
	// vllm:kv_cache_usage_perc (0..1); false when never scraped or stale.
	Scraped          bool
	Waiting, Running float64
	KVUsage          float64
	// SinceScrape is, while Scraped, the change in the router's own count
	// of requests open on the engine since the scrape Waiting and Running
	// come from (those dispatched since, less those finished): a score read
	// from a scrape a few hundred milliseconds old still counts a burst's
	// requests sent since, instead of sending the burst to the engine that
	// last looked idle.
	SinceScrape int64
	// PrefillSecondsPerToken, TransferSecondsPerToken and QueueSeconds
	// are the engine's measured costs, as of its last scrapes with enough
	// traffic to measure them, and like Waiting zero unless Scraped (and
	// each zero until measured): seconds of prefill compute per prompt token
	// it computed (vllm:time_to_first_token_seconds less
	// vllm:request_queue_time_seconds, per
	// vllm:prompt_tokens_by_source{source="local_compute"}); seconds of KV
	// transfer per token it pulled from a prefill engine
	// (tandem:kv_transfer_seconds per
	// vllm:prompt_tokens_by_source{source="external_kv_transfer"}); and
	// the mean time its requests waited before being scheduled
	// (vllm:request_queue_time_seconds).
	PrefillSecondsPerToken, TransferSecondsPerToken, QueueSeconds float64
	// ITLSeconds is a decode engine's mean inter-token latency over its
	// last scrape window with tokens in it
	// (vllm:inter_token_latency_seconds), like the costs above zero unless
	// Scraped.
	ITLSeconds float64
	// PrefillCurve is the engine's prefill seconds by computed prompt
	// tokens, fitted to the proxy's own legs to it: each prefill leg's, and
	// each local decode leg's, Server-Timing prefill against the tokens its
	// usage says it computed (zero until measured; per-token only while
	// few legs are known). Current however busy the engine is.
	PrefillCurve Curve
	// PrefillQueueSeconds is the engine's work on the prefills the proxy
	// has sent it and not yet seen answered (prefill legs, or a decode's
	// local prefills): PrefillCurve over each one's tokens, times the share
	// of its legs' time the engine was busy (prompts computed side by side
	// each report the batch's time). Zero while PrefillCurve is.
	PrefillQueueSeconds float64
	// DecodeQueueSeconds, PullCurve and FirstStepSeconds are a decode
	// engine's remote legs, from their Server-Timing over the latest ones:
	// the mean wait for a seat (queue), the KV pull's seconds by pulled
	// tokens (kv_pull, fitted like PrefillCurve: a pull has a fixed part),
	// and the mean time from the pull's end to the first token (kv_ready +
	// prefill: its first step). Zero until measured.
	DecodeQueueSeconds float64
	PullCurve          Curve
	FirstStepSeconds   float64
	// PrefixBlocks is how many leading blocks of the request the engine
	// holds in its prefix cache, as far as the router knows.
	PrefixBlocks int
}

// Request is what the plugins may look at. They must treat it as read-only.
type Request struct {
	// Path is the API path, ID the request id.
	Path, ID string
	// Body is the client's JSON body as received.
	Body []byte
	// PromptTokens is the prompt's length in tokens: exact when Exact,
	// otherwise estimated from its bytes.
	PromptTokens int
	// MaxTokens is the expected output length (max_tokens, or a default).
	MaxTokens int
	// Exact says whether PromptTokens and BlockHashes come from the model's
	// tokenizer.
	Exact bool
	// BlockSize is the tokens per block BlockHashes was computed with.
	BlockSize int
	// BlockHashes are the prompt's chained block hashes.
	BlockHashes []uint64
	// Near, when set, is the host the prefill should preferably share with
	// the decode already chosen.
	Near string
	// PrefixHits memoizes the prefix index's answer for BlockHashes
	// (leading blocks held, by engine URL) for the request's later picks
	// and its decision: nil until the proxy has asked the index. Plugins
	// read Endpoint.PrefixBlocks instead.
	PrefixHits map[string]int
}

// Filter drops the endpoints that cannot take req. It returns a subset of
// eps (it may reuse eps's storage).
type Filter interface {
	Filter(req *Request, eps []Endpoint) []Endpoint
}

// Scorer rates every endpoint for req: out[i] in [0,1] for eps[i], higher is
// better. len(out) == len(eps).
type Scorer interface {
	Score(req *Request, eps []Endpoint, out []float64)
}

// Picker chooses one endpoint given the weighted sum of the scores (all zero
// when a profile has no scorers). It returns an index into eps; it is called
// with at least one endpoint and from many goroutines at once.
type Picker interface {
	Pick(req *Request, eps []Endpoint, scores []float64) int
}

// Weighted is a scorer and its weight in a profile.
type Weighted struct {
	Name   string
	Scorer Scorer
	Weight float64
}

// Profile is the pipeline of one pool.
type Profile struct {
	Filters []Filter
	Scorers []Weighted
	Picker  Picker
}

// ErrNoCandidate is returned by Run when the filters leave no endpoint.
var ErrNoCandidate = errors.New("no candidate endpoint")

// Run filters, scores and picks. It returns the index into eps of the chosen
// endpoint, or ErrNoCandidate. eps is not modified.
func (p *Profile) Run(req *Request, eps []Endpoint) (int, error) {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	cands := append(sc.cands[:0], eps...)
	defer func() { sc.cands = cands[:0] }()
	for _, f := range p.Filters {
		cands = f.Filter(req, cands)
		if len(cands) == 0 {
			return -1, ErrNoCandidate
		}
	}
	total := resize(&sc.total, len(cands))
	if len(p.Scorers) > 0 {
		one := resize(&sc.one, len(cands))
		for _, s := range p.Scorers {
			clear(one)
			s.Scorer.Score(req, cands, one)
			for i, v := range one {
				total[i] += s.Weight * clamp01(v)
			}
		}
	}
	i := p.Picker.Pick(req, cands, total)
	if i < 0 || i >= len(cands) {
		i = 0
	}
	want := cands[i].Index
	for j := range eps {
		if eps[j].Index == want {
			return j, nil
		}
	}
	return -1, fmt.Errorf("router: picker chose endpoint %d that was not offered", want)
}

// scratch is one Run's working memory, reused across requests: a pick
// allocates nothing once the pool is warm.
type scratch struct {
	cands      []Endpoint
	total, one []float64
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// resize returns (*s)[:n] zeroed, growing *s when it is too short.
func resize(s *[]float64, n int) []float64 {
	if cap(*s) < n {
		*s = make([]float64, n)
	}
	out := (*s)[:n]
	clear(out)
	return out
}

func clamp01(v float64) float64 {
	switch {
	case v < 0 || v != v:
		return 0
	case v > 1:
		return 1
	}
	return v
}

// Decision is what a disaggregation decider answers.
type Decision struct {
	// Remote says to prefill on a prefill engine; false: the decode
	// prefills locally.
	Remote bool
	// Reason is a short label, the reason of x-tandem-pd and of
	// tandem:proxy_pd_decisions_total.
	Reason string
}

// DecideInput is what a decider may look at: the request, the chosen decode
// and the prefill pool after its filters (empty when every prefill engine is
// unhealthy or saturated).
type DecideInput struct {
	Req            *Request
	Decode         Endpoint
	PrefillHealthy int // prefill engines healthy
	PrefillFree    int // of those, not saturated
	// Prefill is those PrefillFree engines, for a decider that prices
	// them.
	Prefill []Endpoint
}

// Decider decides between remote and local prefill.
type Decider interface {
	Decide(in DecideInput) Decision
}
