package openai

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvparams"
)

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	s.serveGeneration(w, r, &CompletionRequest{})
}

// The completions route's parts of serveGeneration.
func (req *CompletionRequest) sampling() *SamplingFields { return &req.SamplingFields }
func (req *CompletionRequest) job(s *Server, extID string) (*job, *Error) {
	return s.completionJob(req, extID)
}
func (req *CompletionRequest) idPrefix() string { return "cmpl-" }
func (req *CompletionRequest) logprobsOut() logprobsOut {
	return logprobsOut{on: req.Logprobs != nil, asIDs: boolOr(req.ReturnTokensAsTokenIDs, false)}
}
func (req *CompletionRequest) stream(s *Server, w http.ResponseWriter, r *http.Request, run *run, meta responseMeta, includeUsage bool, lp logprobsOut) {
	s.streamCompletion(w, r, run, meta, includeUsage, lp)
}
func (req *CompletionRequest) complete(s *Server, w http.ResponseWriter, r *http.Request, run *run, meta responseMeta, lp logprobsOut) {
	s.completeCompletion(w, r, run, meta, lp)
}

// errNoFinal reports an engine stream that closed without a final event.
var errNoFinal = errors.New("the request's event stream ended without a final event")

// responseMeta is what every response and chunk of one request repeats.
type responseMeta struct {
	id      string
	created int64
	model   string
}

// completionJob validates a completion request and tokenizes its prompts.
func (s *Server) completionJob(req *CompletionRequest, extID string) (*job, *Error) {
	if err := s.checkModel(req.Model); err != nil {
		return nil, err
	}
	if req.Echo && req.Logprobs != nil {
		// With echo, OpenAI and vLLM return the prompt's logprobs too;
		// the engine does not compute them, and sampled-token logprobs
		// alone would misalign with the echoed text.
		return nil, BadRequest("echo", "echo together with logprobs needs the prompt's logprobs, which Tandem does not compute; drop logprobs or echo")
	}
	if req.Logprobs != nil && (*req.Logprobs < 0 || *req.Logprobs > maxTopLogprobs) {
		return nil, BadRequest("logprobs", "logprobs must be between 0 and %d, got %d", maxTopLogprobs, *req.Logprobs)
	}
	base, err := buildParams(&req.SamplingFields, s.cfg.Defaults)
	if err != nil {
		return nil, err
	}
	if req.Logprobs != nil {
		base.Logprobs = *req.Logprobs
	}
	kv, err := s.kvTransfer(&req.SamplingFields)
	if err != nil {
		return nil, err
	}
	prompts, err := ParsePrompt(req.Prompt)
	if err != nil {
		return nil, err
	}
	if len(prompts) == 0 {
		return nil, BadRequest("prompt", "prompt must not be empty")
	}
	if kv != nil && len(prompts) > 1 {
		return nil, BadRequest("kv_transfer_params", "kv_transfer_params apply to one prompt; got %d prompts", len(prompts))
	}
	n, err := choicesPerPrompt(&req.SamplingFields, kv)
	if err != nil {
		return nil, err
	}
	j := &job{extID: extID, kv: kv, n: n}
	for i, p := range prompts {
		param := "prompt"
		if len(prompts) > 1 {
			param = "prompt[" + itoa(i) + "]"
		}
		ids, text := p.Tokens, p.Text
		if p.IsTokens {
			if err := s.checkTokenIDs(ids, param); err != nil {
				return nil, err
			}
			if req.Echo {
				text = s.cfg.Tokenizer.Decode(ids, !base.KeepSpecialTokens)
			}
		} else {
			// "" is a prompt too: with a BOS it is [BOS], as in vLLM.
			var err *Error
			if ids, err = s.encodePrompt(p.Text, true, param); err != nil {
				return nil, err
			}
		}
		if len(ids) == 0 {
			return nil, BadRequest(param, "prompt must not be empty")
		}
		params := base
		maxTokens, err := resolveMaxTokens(req.MaxTokens, "max_tokens", completionsDefaultMaxTokens, s.cfg.Defaults, len(ids), s.cfg.Backend.MaxModelLen(), param)
		if err != nil {
			return nil, err
		}
		params.MaxTokens = maxTokens
		if err := validateParams(&params, s.cfg.Tokenizer.VocabSize()); err != nil {
			return nil, err
		}
		j.prompts = append(j.prompts, ids)
		j.params = append(j.params, params)
		if req.Echo {
			j.echo = append(j.echo, text)
		}
	}
	return j, nil
}

// kvTransfer parses kv_transfer_params and rejects a streaming prefill leg.
func (s *Server) kvTransfer(f *SamplingFields) (*kvparams.Params, *Error) {
	kv, err := parseKVTransfer(f.KVTransferParams)
	if err != nil {
		return nil, err
	}
	if f.Stream {
		if kv != nil && kv.DoRemoteDecode {
			return nil, BadRequest("kv_transfer_params", "kv_transfer_params need a non-streaming response: the proxy calls the prefill engine with stream=false")
		}
	}
	return kv, nil
}

// choiceState accumulates one choice of a response.
type choiceState struct {
	text     strings.Builder
	logprobs *CompletionLogprobs
	chat     []ChatTokenLogprob
	offset   int
	final    engine.Event
	done     bool
	timing   *engine.Timing // the first token's
}

// collect reads a run to its end, gathering logprobs in the completions
// format or, with chat set, the chat format. It returns the choices, or an
// API error when a request failed, or ok=false when the client went away.
func (s *Server) collect(r *http.Request, run *run, lp logprobsOut, chat bool) ([]choiceState, *Error, bool) {
	st := make([]choiceState, run.j.choices())
	for {
		ie, ok := run.next(r.Context())
		if !ok {
			break
		}
		c := &st[ie.i]
		c.text.WriteString(ie.ev.Text)
		if ie.ev.Timing != nil && c.timing == nil {
			c.timing = ie.ev.Timing
		}
		switch {
		case lp.on && chat:
			c.chat = append(c.chat, s.chatLogprobs(ie.ev.Logprobs, lp.asIDs)...)
		case lp.on:
			if c.logprobs == nil {
				c.logprobs = &CompletionLogprobs{}
			}
			c.offset = s.completionLogprobs(c.logprobs, ie.ev.Logprobs, c.offset, lp.asIDs)
		}
		if ie.ev.Finish != engine.FinishNone {
			if failed(ie.ev) {
				return nil, finishError(ie.ev), true
			}
			c.final, c.done = ie.ev, true
		}
	}
	if r.Context().Err() != nil {
		return nil, nil, false
	}
	for i := range st {
		if !st[i].done {
			return nil, finishError(engine.Event{Finish: engine.FinishError, Err: errNoFinal}), true
		}
	}
	return st, nil, true
}

func (s *Server) completeCompletion(w http.ResponseWriter, r *http.Request, run *run, meta responseMeta, lp logprobsOut) {
	st, err, ok := s.collect(r, run, lp, false)
	if !ok {
		return
	}
	if err != nil {
		WriteError(w, err)
		return
	}
	resp := CompletionResponse{ID: meta.id, Object: "text_completion", Created: meta.created, Model: meta.model, Usage: &Usage{}}
	for i := range st {
		c := &st[i]
		resp.Choices = append(resp.Choices, CompletionChoice{
			Index:        i,
			Text:         run.echo(i) + c.text.String(),
			Logprobs:     c.logprobs,
			FinishReason: finishReason(c.final.Finish),
			StopReason:   stopReason(c.final),
		})
		run.addUsage(resp.Usage, i, c.final.Usage)
	}
	resp.KVTransferParams = st[0].final.KVTransfer
	setTiming(w.Header(), st[0].timing, run.api)
	s.writeAnswer(w, r, run, resp)
}

func (s *Server) streamCompletion(w http.ResponseWriter, r *http.Request, run *run, meta responseMeta, includeUsage bool, lp logprobsOut) {
	chunk := func(choices []CompletionChoice) CompletionChunk {
		c := CompletionChunk{ID: meta.id, Object: "text_completion", Created: meta.created, Model: meta.model, Choices: choices}
		if includeUsage {
			c.Usage = nullJSON
		}
		return c
	}
	n := run.j.choices()
	offsets := make([]int, n)
	echoed := make([]bool, n)
	var usage Usage
	finals := 0
	sw := NewSSEWriter(w, s.cfg.WriteTimeout)
	for {
		ie, ok := run.next(r.Context())
		if !ok {
			break
		}
		ev := ie.ev
		if failed(ev) {
			s.streamFailure(w, sw, ev)
			return
		}
		if !sw.Started() {
			setTiming(w.Header(), ev.Timing, run.api)
		}
		text := ev.Text
		if !echoed[ie.i] {
			// The choice's first chunk carries the echoed prompt.
			echoed[ie.i] = true
			text = run.echo(ie.i) + text
		}
		if text != "" || len(ev.Logprobs) > 0 {
			c := CompletionChoice{Index: ie.i, Text: text}
			if lp.on {
				c.Logprobs = &CompletionLogprobs{}
				offsets[ie.i] = s.completionLogprobs(c.Logprobs, ev.Logprobs, offsets[ie.i], lp.asIDs)
			}
			if sw.Data(chunk([]CompletionChoice{c})) != nil {
				return
			}
		}
		if ev.Finish != engine.FinishNone {
			finals++
			run.addUsage(&usage, ie.i, ev.Usage)
			c := CompletionChoice{Index: ie.i, FinishReason: finishReason(ev.Finish), StopReason: stopReason(ev)}
			ch := chunk([]CompletionChoice{c})
			if ie.i == 0 {
				ch.KVTransferParams = ev.KVTransfer
			}
			if sw.Data(ch) != nil {
				return
			}
		}
	}
	s.endStream(w, r, sw, finals == n, includeUsage, usage, func(u json.RawMessage) any {
		return CompletionChunk{ID: meta.id, Object: "text_completion", Created: meta.created, Model: meta.model, Choices: []CompletionChoice{}, Usage: u}
	})
}

// streamFailure reports a failed request: as a JSON error response when
// nothing was streamed yet, else as an error event followed by [DONE].
func (s *Server) streamFailure(w http.ResponseWriter, sw *SSEWriter, ev engine.Event) {
	err := finishError(ev)
	if !sw.Started() {
		WriteError(w, err)
		return
	}
	if sw.Error(err) == nil {
		_ = sw.Done()
	}
}

// endStream writes the usage chunk (if asked for) and [DONE], unless the
// client has gone. complete says every choice had its final event.
func (s *Server) endStream(w http.ResponseWriter, r *http.Request, sw *SSEWriter, complete, includeUsage bool, usage Usage, usageChunk func(json.RawMessage) any) {
	if r.Context().Err() != nil {
		return
	}
	if !complete {
		s.streamFailure(w, sw, engine.Event{Finish: engine.FinishError, Err: errNoFinal})
		return
	}
	if includeUsage {
		u, _ := json.Marshal(usage) // a struct of ints always marshals
		if sw.Data(usageChunk(u)) != nil {
			return
		}
	}
	_ = sw.Done()
}
