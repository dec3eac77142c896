package openai

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"sync"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/sample"
)

// job is a validated generation request: one engine request per prompt.
type job struct {
	extID   string
	prompts [][]int32
	params  []sample.Params
	kv      map[string]any
}

// indexedEvent is an engine event of prompt i.
type indexedEvent struct {
	i  int
	ev engine.Event
}

// run is a job in flight.
type run struct {
	s        *Server
	handles  []*engine.Handle
	finished []bool
	events   <-chan indexedEvent
	cancel   context.CancelFunc
}

// start submits every prompt of j. The requests live as long as ctx (the
// client's connection) and until close is called.
func (s *Server) start(ctx context.Context, j *job) (*run, *Error) {
	if s.draining.Load() {
		return nil, NewError(http.StatusServiceUnavailable, "", "the server is shutting down; retry on another instance")
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &run{s: s, cancel: cancel, finished: make([]bool, len(j.prompts))}
	for i, prompt := range j.prompts {
		req := &engine.Request{
			ID:         internalID(j.extID, i, len(j.prompts)),
			Prompt:     prompt,
			Params:     j.params[i],
			KVTransfer: j.kv,
		}
		h, err := s.cfg.Backend.Submit(ctx, req)
		if err != nil {
			r.close()
			return nil, submitError(err)
		}
		r.handles = append(r.handles, h)
	}
	r.events = merge(ctx, r.handles)
	return r, nil
}

// close aborts the requests that have not finished and releases the run.
func (r *run) close() {
	r.cancel()
	for i, h := range r.handles {
		if !r.finished[i] {
			r.s.cfg.Backend.Abort(h.ID)
		}
	}
}

// next returns the next event, or ok=false when all streams ended or ctx
// was cancelled.
func (r *run) next(ctx context.Context) (indexedEvent, bool) {
	select {
	case ie, ok := <-r.events:
		if ok && ie.ev.Finish != engine.FinishNone {
			r.finished[ie.i] = true
		}
		return ie, ok
	case <-ctx.Done():
		return indexedEvent{}, false
	}
}

// merge fans the handles' events into one channel, closed when every
// handle's channel is. After ctx ends, the forwarders keep draining their
// handles (without forwarding) so the engine never blocks on a reader that
// went away.
func merge(ctx context.Context, hs []*engine.Handle) <-chan indexedEvent {
	out := make(chan indexedEvent, len(hs))
	var wg sync.WaitGroup
	for i, h := range hs {
		wg.Go(func() {
			for ev := range h.Events {
				select {
				case out <- indexedEvent{i, ev}:
				case <-ctx.Done():
				}
			}
		})
	}
	go func() {
		wg.Wait()
		close(out)
	}()
	return out
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

// usageOf turns engine usage into API usage.
func usageOf(u engine.Usage) Usage {
	return Usage{
		PromptTokens:        u.PromptTokens,
		CompletionTokens:    u.CompletionTokens,
		TotalTokens:         u.PromptTokens + u.CompletionTokens,
		PromptTokensDetails: PromptTokensDetails{CachedTokens: u.CachedTokens},
	}
}

func addUsage(a *Usage, u engine.Usage) {
	b := usageOf(u)
	a.PromptTokens += b.PromptTokens
	a.CompletionTokens += b.CompletionTokens
	a.TotalTokens += b.TotalTokens
	a.PromptTokensDetails.CachedTokens += b.PromptTokensDetails.CachedTokens
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

// completionLogprobs appends the legacy-format logprobs of lps to dst.
// offset is the text offset of the first token; the new offset is returned.
func (s *Server) completionLogprobs(dst *CompletionLogprobs, lps []engine.TokenLogprob, offset int) int {
	tok := s.cfg.Tokenizer
	for _, lp := range lps {
		text := tok.TokenText(lp.Token)
		dst.Tokens = append(dst.Tokens, text)
		dst.TokenLogprobs = append(dst.TokenLogprobs, finiteLogprob(lp.Logprob))
		top := make(map[string]float64, len(lp.Top)+1)
		top[text] = finiteLogprob(lp.Logprob)
		for _, t := range lp.Top {
			top[tok.TokenText(t.Token)] = finiteLogprob(t.Logprob)
		}
		dst.TopLogprobs = append(dst.TopLogprobs, top)
		dst.TextOffset = append(dst.TextOffset, offset)
		offset += len(text)
	}
	return offset
}

// chatLogprobs returns the chat-format logprobs of lps.
func (s *Server) chatLogprobs(lps []engine.TokenLogprob) []ChatTokenLogprob {
	tok := s.cfg.Tokenizer
	out := make([]ChatTokenLogprob, len(lps))
	for i, lp := range lps {
		text := tok.TokenText(lp.Token)
		top := make([]ChatTopLogprob, len(lp.Top))
		for j, t := range lp.Top {
			tt := tok.TokenText(t.Token)
			top[j] = ChatTopLogprob{Token: tt, Logprob: finiteLogprob(t.Logprob), Bytes: byteList(tt)}
		}
		out[i] = ChatTokenLogprob{Token: text, Logprob: finiteLogprob(lp.Logprob), Bytes: byteList(text), TopLogprobs: top}
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
