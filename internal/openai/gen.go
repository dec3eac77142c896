package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvparams"
	"github.com/tandem-serve/tandem/internal/sample"
)

// job is a validated generation request: n choices of each prompt, each
// choice one engine request.
type job struct {
	extID   string
	prompts [][]int32
	params  []sample.Params // per prompt
	// n is the number of choices per prompt; choice c of prompt p has the
	// index p*n+c in the response, as in OpenAI's API and vLLM.
	n  int
	kv *kvparams.Params
	// echo is each prompt's text, prepended to its choices' text (echo).
	echo []string
}

// choices is the number of choices of the whole response.
func (j *job) choices() int { return len(j.prompts) * j.n }

// request is the engine request of choice c of prompt p. With a seed,
// choice c samples with seed+c (vLLM v1's rule for the child requests of
// n > 1), so choice 0 equals the n = 1 request. Only choice 0 carries the
// kv_transfer_params: on a decode engine it pulls the prompt's KV, and the
// other choices find those blocks in the prefix cache.
func (j *job) request(p, c int) *engine.Request {
	k := p*j.n + c
	params := j.params[p]
	if c > 0 && params.HasSeed {
		params.Seed += uint64(c)
	}
	r := &engine.Request{ID: internalID(j.extID, k, j.choices()), Prompt: j.prompts[p], Params: params}
	if c == 0 {
		r.KVTransfer = j.kv
	}
	return r
}

// indexedEvent is an engine event of choice i.
type indexedEvent struct {
	i  int
	ev engine.Event
}

// run is a job in flight.
//
// With n > 1 the prompt is computed once: start submits choice 0 of each
// prompt, and when its first event arrives (its prompt has been computed and
// its full blocks are in the prefix cache, or pulled from a prefill engine)
// that choice's forwarder submits choices 1..n-1, which find the prompt's
// blocks in the prefix cache and compute only its last partial block. vLLM
// forks the n sequences inside the engine instead; doing it here keeps the
// engine's one-request-one-sequence model, at the cost of recomputing up to
// a block of prompt tokens per extra choice.
type run struct {
	s      *Server
	j      *job
	ctx    context.Context
	cancel context.CancelFunc
	// api is the handler's time before the engine had the request
	// (reading, validating and tokenizing it), for Server-Timing.
	api time.Duration
	out chan indexedEvent
	wg  sync.WaitGroup // forwarders; out closes when none is left

	mu      sync.Mutex
	closed  bool
	handles []*engine.Handle // by choice; nil until submitted

	finished []bool // by choice; read and written by the handler only

	// heldKV is the kv_transfer_params of a prefill leg's answer
	// (do_remote_decode): from its final event on, this engine holds the
	// prompt's KV for a remote decode. delivered is set once the answer
	// carrying them was written to the client. A run that ends (handler
	// done, forwarders done) with heldKV undelivered releases the hold at
	// once: nobody else has the params to pull or release it, and the
	// lease would keep the blocks for its whole length. Guarded by mu.
	heldKV         json.RawMessage
	delivered      bool
	forwardersDone bool
	settled        bool

	trace *runTrace // nil while tracing is off
}

// start submits choice 0 of every prompt of j (and, as they start
// producing, the other choices). The requests live as long as ctx (the
// client's connection) and until close is called.
func (s *Server) start(ctx context.Context, j *job) (*run, *Error) {
	if s.draining.Load() {
		return nil, NewError(http.StatusServiceUnavailable, "", "the server is shutting down; retry on another instance")
	}
	ctx, cancel := context.WithCancel(ctx)
	total := j.choices()
	r := &run{
		s: s, j: j, ctx: ctx, cancel: cancel,
		out:      make(chan indexedEvent, total),
		handles:  make([]*engine.Handle, total),
		finished: make([]bool, total),
	}
	r.trace = traceOf(ctx)
	r.trace.started(j)
	for p := range j.prompts {
		h, err := s.cfg.Backend.Submit(ctx, j.request(p, 0))
		if err != nil {
			r.close()
			return nil, submitError(err)
		}
		r.track(p, 0, h)
	}
	// Every forwarder that will ever run is either started above or
	// started by one of those while it is still running, so the count
	// reaches zero only once all of them are done.
	go func() {
		r.wg.Wait()
		close(r.out)
		r.mu.Lock()
		r.forwardersDone = true
		r.mu.Unlock()
		r.settle()
	}()
	return r, nil
}

// track records the handle of choice c of prompt p and starts forwarding
// its events. A handle submitted after close is aborted at once.
func (r *run) track(p, c int, h *engine.Handle) {
	k := p*r.j.n + c
	r.mu.Lock()
	r.handles[k] = h
	closed := r.closed
	r.mu.Unlock()
	if closed {
		r.s.cfg.Backend.Abort(h.ID)
	}
	r.wg.Add(1)
	go r.forward(p, c, h)
}

// forward moves one handle's events to out. After the run's context ends it
// keeps draining the handle (without forwarding) so the engine never blocks
// on a reader that went away. The forwarder of choice 0 submits the other
// choices of its prompt on its first event, unless that event is a failure.
func (r *run) forward(p, c int, h *engine.Handle) {
	defer r.wg.Done()
	k := p*r.j.n + c
	first := c == 0 && r.j.n > 1
	for ev := range h.Events {
		if ev.Finish != engine.FinishNone && len(ev.KVTransfer) > 0 && r.j.kv != nil && r.j.kv.DoRemoteDecode {
			r.mu.Lock()
			r.heldKV = ev.KVTransfer
			r.mu.Unlock()
		}
		if first {
			first = false
			if !failed(ev) {
				r.submitRest(p)
			}
		}
		r.trace.observe(k, &ev)
		r.send(indexedEvent{k, ev})
	}
}

func (r *run) send(ie indexedEvent) {
	select {
	case r.out <- ie:
	case <-r.ctx.Done():
	}
}

// submitRest submits choices 1..n-1 of prompt p. A refused submission is
// reported as that choice's failure, which fails the whole request (and
// close aborts the choices already running).
func (r *run) submitRest(p int) {
	for c := 1; c < r.j.n; c++ {
		if r.ctx.Err() != nil {
			return
		}
		h, err := r.s.cfg.Backend.Submit(r.ctx, r.j.request(p, c))
		if err != nil {
			ev := engine.Event{Finish: engine.FinishError, Err: fmt.Errorf("submitting choice %d: %w", c, err)}
			if errors.Is(err, engine.ErrShuttingDown) {
				ev = engine.Event{Finish: engine.FinishAbort}
			}
			r.send(indexedEvent{p*r.j.n + c, ev})
			return
		}
		r.track(p, c, h)
	}
}

// close aborts the requests that have not finished and releases the run.
// Choices submitted later are aborted as they are tracked.
func (r *run) close() {
	r.cancel()
	r.mu.Lock()
	r.closed = true
	hs := append([]*engine.Handle(nil), r.handles...)
	r.mu.Unlock()
	for i, h := range hs {
		if h != nil && !r.finished[i] {
			r.s.cfg.Backend.Abort(h.ID)
		}
	}
	r.settle()
}

// markDelivered records that the answer, with any kv_transfer_params it
// carries, reached the client.
func (r *run) markDelivered() {
	r.mu.Lock()
	r.delivered = true
	r.mu.Unlock()
}

// settle releases a prefill leg's KV hold whose answer never reached the
// client, once both the handler (close) and every forwarder are done, so
// that a final event still on its way is seen. It acts once.
func (r *run) settle() {
	r.mu.Lock()
	if !r.closed || !r.forwardersDone || r.settled {
		r.mu.Unlock()
		return
	}
	r.settled = true
	kv := r.heldKV
	if r.delivered {
		kv = nil
	}
	r.mu.Unlock()
	if kv != nil {
		r.s.releaseUndelivered(kv)
	}
}

// next returns the next event, or ok=false when all streams ended or ctx
// was cancelled.
func (r *run) next(ctx context.Context) (indexedEvent, bool) {
	select {
	case ie, ok := <-r.out:
		if ok && ie.ev.Finish != engine.FinishNone {
			r.finished[ie.i] = true
		}
		return ie, ok
	case <-ctx.Done():
		return indexedEvent{}, false
	}
}

// echo is the prompt text choice k starts with: its prompt's with echo,
// else "".
func (r *run) echo(k int) string {
	if r.j.echo == nil {
		return ""
	}
	return r.j.echo[k/r.j.n]
}

// addUsage adds choice k's usage to a. Completion tokens add up over the
// choices; the prompt counts once per prompt (it was computed once), with
// the cached tokens of its first choice, as vLLM and OpenAI report n > 1.
func (r *run) addUsage(a *Usage, k int, u engine.Usage) {
	if k%r.j.n == 0 {
		a.PromptTokens += u.PromptTokens
		a.PromptTokensDetails.CachedTokens += u.CachedTokens
	}
	a.CompletionTokens += u.CompletionTokens
	a.TotalTokens = a.PromptTokens + a.CompletionTokens
}

// finishError is the API error for a request that ended in FinishError or
// FinishAbort (an abort the client did not cause, e.g. a shutdown deadline).
func finishError(ev engine.Event) *Error {
	if ev.Finish == engine.FinishAbort {
		return NewError(http.StatusServiceUnavailable, "", "the request was aborted before it finished (the engine may be shutting down); retry")
	}
	msg := "the request failed in the engine"
	if ev.Err != nil {
		msg += ": " + ev.Err.Error()
	}
	return NewError(http.StatusInternalServerError, "", "%s", msg)
}

func failed(ev engine.Event) bool {
	return ev.Finish == engine.FinishError || ev.Finish == engine.FinishAbort
}

// finishReason is the API's finish_reason for an engine finish.
func finishReason(f engine.FinishReason) *string {
	var s string
	switch f {
	case engine.FinishStop:
		s = "stop"
	case engine.FinishLength:
		s = "length"
	default:
		return nil
	}
	return &s
}

// stopReason is vLLM's stop_reason: the matched stop string, or the stop
// token id as a number, or null.
func stopReason(ev engine.Event) any {
	if ev.Finish != engine.FinishStop || ev.StopReason == "" {
		return nil
	}
	return ev.StopReason
}

var nullJSON = json.RawMessage("null")

// finiteLogprob maps -Inf and NaN, which JSON cannot carry, to -9999 as
// vLLM does.
func finiteLogprob(lp float32) float64 {
	f := float64(lp)
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return -9999
	}
	return f
}

// logprobsOut says whether a response carries logprobs and how they name
// tokens.
type logprobsOut struct {
	// on is set when the request asked for logprobs.
	on bool
	// asIDs is vLLM's return_tokens_as_token_ids: tokens are named
	// "token_id:N" instead of by their text, so that tokens whose text is
	// not valid UTF-8 on its own stay distinguishable.
	asIDs bool
}

// tokenIDName is how vLLM names a token under return_tokens_as_token_ids.
func tokenIDName(id int32) string {
	return "token_id:" + strconv.FormatInt(int64(id), 10)
}

// tokenName is the name of token id in logprobs: its text, or "token_id:N".
func (s *Server) tokenName(id int32, asIDs bool) string {
	if asIDs {
		return tokenIDName(id)
	}
	return s.cfg.Tokenizer.TokenText(id)
}

// completionLogprobs appends the legacy-format logprobs of lps to dst.
// offset is the text offset of the first token; the new offset is returned.
// As in vLLM, the offset advances by the length of each token's name, so
// under asIDs it counts the "token_id:N" names.
func (s *Server) completionLogprobs(dst *CompletionLogprobs, lps []engine.TokenLogprob, offset int, asIDs bool) int {
	for _, lp := range lps {
		text := s.tokenName(lp.Token, asIDs)
		dst.Tokens = append(dst.Tokens, text)
		dst.TokenLogprobs = append(dst.TokenLogprobs, finiteLogprob(lp.Logprob))
		top := make(map[string]float64, len(lp.Top)+1)
		top[text] = finiteLogprob(lp.Logprob)
		for _, t := range lp.Top {
			top[s.tokenName(t.Token, asIDs)] = finiteLogprob(t.Logprob)
		}
		dst.TopLogprobs = append(dst.TopLogprobs, top)
		dst.TextOffset = append(dst.TextOffset, offset)
		offset += len(text)
	}
	return offset
}

// chatLogprobs returns the chat-format logprobs of lps. Under asIDs, as in
// vLLM, a sampled token's "bytes" stay those of its text while each top
// entry's are those of its "token_id:N" name.
func (s *Server) chatLogprobs(lps []engine.TokenLogprob, asIDs bool) []ChatTokenLogprob {
	out := make([]ChatTokenLogprob, len(lps))
	for i, lp := range lps {
		top := make([]ChatTopLogprob, len(lp.Top))
		for j, t := range lp.Top {
			tt := s.tokenName(t.Token, asIDs)
			top[j] = ChatTopLogprob{Token: tt, Logprob: finiteLogprob(t.Logprob), Bytes: byteList(tt)}
		}
		text := s.cfg.Tokenizer.TokenText(lp.Token)
		out[i] = ChatTokenLogprob{Token: s.tokenName(lp.Token, asIDs), Logprob: finiteLogprob(lp.Logprob), Bytes: byteList(text), TopLogprobs: top}
	}
	return out
}

// byteList is OpenAI's "bytes": the UTF-8 bytes of a token's text.
func byteList(s string) []int {
	b := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		b[i] = int(s[i])
	}
	return b
}
