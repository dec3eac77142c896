package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/tandem-serve/tandem/internal/sample"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// reqState is the step loop's view of one request.
type reqState struct {
	id        string // internal: ext plus a random suffix
	ext       string // the client's id (Request.ID or generated)
	req       *Request
	sr        *sched.Request
	sampler   *sample.Sampler
	dec       *tokenizer.StreamDecoder
	stop      *sample.StopChecker
	stopIDs   map[int32]bool // EOS unless ignore_eos, and stop_token_ids
	userStops map[int32]bool // stop_token_ids only (reported as stop_reason)
	maxTokens int
	out       *stream

	stopReason                     string
	arrival, firstToken, lastToken time.Time
	scheduled                      bool
	// admitted, loaded and started time the request's way to its first
	// token (Timing): when the scheduler first gave it blocks or a batch
	// slot, when a KV connector finished loading its prompt's KV, and the
	// step that first ran it.
	admitted, loaded, started time.Time
}

// timing is rs's Timing at its first token, now.
func (rs *reqState) timing(now time.Time) *Timing {
	admitted := rs.admitted
	if admitted.IsZero() {
		admitted = rs.arrival
	}
	t := &Timing{Queue: admitted.Sub(rs.arrival)}
	computed := admitted
	if !rs.loaded.IsZero() && rs.loaded.After(admitted) {
		t.KVLoad, computed = rs.loaded.Sub(admitted), rs.loaded
		if rs.started.After(rs.loaded) {
			t.KVReady, computed = rs.started.Sub(rs.loaded), rs.started
		}
	}
	t.Prefill = max(now.Sub(computed), 0)
	return t
}

// fetchStages observes the time rs's asynchronous KV load spent in each
// fetch stage, when the request first runs at now.
func (e *Engine) fetchStages(rs *reqState, now time.Time) {
	if e.m == nil || rs.loaded.IsZero() {
		return
	}
	h := e.m.KVFetchStageSeconds
	h.WithLabelValues("waiting_to_start").Observe(max(rs.admitted.Sub(rs.arrival), 0).Seconds())
	h.WithLabelValues("in_progress").Observe(max(rs.loaded.Sub(rs.admitted), 0).Seconds())
	h.WithLabelValues("completed_waiting").Observe(max(now.Sub(rs.loaded), 0).Seconds())
}

// Submit validates and queues a request. Its events arrive on the returned
// Handle; cancelling ctx aborts the request and frees its KV blocks.
func (e *Engine) Submit(ctx context.Context, r *Request) (*Handle, error) {
	if r == nil {
		return nil, &InvalidRequestError{Message: "no request"}
	}
	r, maxTokens, kvParams, err := e.check(r)
	if err != nil {
		e.RejectKVTransfer(r.KVTransfer)
		return nil, err
	}
	ext := r.ID
	if ext == "" {
		ext = uuid.NewString()
	}
	// The internal id gets a random suffix, as in vLLM: a request id stays
	// in the scheduler after the request finished while a KV connector
	// holds its blocks (a prefill for a remote decode), and the same client
	// id may meanwhile arrive again, e.g. as the decode leg of the same
	// request on an engine that does both.
	id := ext + "-" + uuid.NewString()[:8]

	p := r.Params
	rs := &reqState{
		id: id, ext: ext, req: r, maxTokens: maxTokens, out: newStream(),
		sampler: sample.NewSampler(&p, e.model.VocabSize(), e.eos),
		dec:     tokenizer.NewDecoder(e.tok, !p.KeepSpecialTokens, r.Prompt),
		stopIDs: map[int32]bool{}, userStops: map[int32]bool{},
		arrival: e.clock.Now(),
	}
	if len(p.Stop) > 0 {
		rs.stop = sample.NewStopChecker(p.Stop, p.IncludeStopStrInOutput)
	}
	if !p.IgnoreEOS {
		for _, t := range e.eos {
			rs.stopIDs[t] = true
		}
	}
	for _, t := range p.StopTokenIDs {
		rs.stopIDs[t], rs.userStops[t] = true, true
	}
	rs.sr = &sched.Request{ID: id, Prompt: r.Prompt, MaxTokens: maxTokens, KVParams: kvParams}

	// The request is posted under the lock that Shutdown takes to set
	// closing, so it is either refused here or in the inbox ahead of the
	// drain message, and the drain waits for it to finish: a request can
	// never arrive after the loop stopped and wait forever for its final
	// event.
	e.mu.Lock()
	switch {
	case e.closing:
		// The KV a prefill holds for this request stays held: a draining
		// engine's 503 tells a router to send the leg to another decode,
		// which pulls it (the proxy releases it if none can).
		e.mu.Unlock()
		return nil, ErrShuttingDown
	case e.live[ext]:
		e.mu.Unlock()
		e.RejectKVTransfer(r.KVTransfer)
		return nil, &InvalidRequestError{Message: fmt.Sprintf("request id %q is already in flight: use a unique X-Request-Id", ext), Param: "request_id"}
	}
	e.live[ext] = true
	e.in.post(rs)
	e.mu.Unlock()
	events := make(chan Event, 1)
	go rs.out.forward(ctx, events, func() { e.Abort(id) })
	return &Handle{ID: id, Events: events}, nil
}

// check validates r, the KV connector's part first, and returns the request
// to run (a copy when the connector caps its output), its effective
// max_tokens, and its kv_transfer_params for the scheduler half of the
// connector: what the connector's check made of them, or r.KVTransfer for a
// connector that checks nothing.
func (e *Engine) check(r *Request) (*Request, int, any, error) {
	var kvParams any
	if r.KVTransfer != nil {
		kvParams = r.KVTransfer
	}
	if kc, ok := e.cfg.Connector.(KVRequestChecker); ok && r.KVTransfer != nil {
		limit, parsed, err := kc.CheckKVTransfer(r.KVTransfer, r.Prompt)
		if err != nil {
			return r, 0, nil, err
		}
		kvParams = parsed
		if limit > 0 && (r.Params.MaxTokens <= 0 || r.Params.MaxTokens > limit) {
			c := *r
			c.Params.MaxTokens = limit
			c.Params.MinTokens = min(c.Params.MinTokens, limit)
			r = &c
		}
	}
	maxTokens, err := e.validate(r)
	return r, maxTokens, kvParams, err
}

// validate checks what the engine itself depends on and returns the
// effective max_tokens.
func (e *Engine) validate(r *Request) (int, error) {
	if len(r.Prompt) == 0 {
		return 0, &InvalidRequestError{Message: "the prompt is empty: send at least one token", Param: "prompt"}
	}
	vocab := e.model.VocabSize()
	for i, t := range r.Prompt {
		if t < 0 || int(t) >= vocab {
			return 0, &InvalidRequestError{Message: fmt.Sprintf("token id %d at position %d is outside the vocabulary [0, %d)", t, i, vocab), Param: "prompt"}
		}
	}
	maxTokens := r.Params.MaxTokens
	if maxTokens <= 0 {
		maxTokens = e.maxModelLen - len(r.Prompt)
		if maxTokens <= 0 {
			return 0, &InvalidRequestError{Message: fmt.Sprintf("this model's maximum context length is %d tokens, but the prompt has %d: shorten the prompt", e.maxModelLen, len(r.Prompt)), Param: "prompt"}
		}
	}
	if n := len(r.Prompt) + maxTokens; n > e.maxModelLen {
		return 0, &InvalidRequestError{Message: fmt.Sprintf("this model's maximum context length is %d tokens, but you requested %d (%d in the prompt, %d in the completion): reduce the prompt or max_tokens", e.maxModelLen, n, len(r.Prompt), maxTokens), Param: "max_tokens"}
	}
	p := r.Params
	p.MaxTokens = maxTokens
	if err := sample.Validate(&p, vocab); err != nil {
		if pe, ok := errors.AsType[*sample.ParamError](err); ok {
			return 0, &InvalidRequestError{Message: pe.Message, Param: pe.Param}
		}
		return 0, &InvalidRequestError{Message: err.Error()}
	}
	if r.Params.MinTokens > maxTokens {
		return 0, &InvalidRequestError{Message: fmt.Sprintf("min_tokens %d is larger than max_tokens %d", r.Params.MinTokens, maxTokens), Param: "min_tokens"}
	}
	return maxTokens, nil
}

// Abort ends a request early with FinishAbort; unknown or finished ids are
// ignored.
func (e *Engine) Abort(id string) { e.in.post(abortMsg(id)) }
