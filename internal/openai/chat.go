package openai

import (
	"encoding/json"
	"net/http"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/sample"
)

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	s.serveGeneration(w, r, &ChatCompletionRequest{})
}

// The chat route's parts of serveGeneration.
func (req *ChatCompletionRequest) sampling() *SamplingFields { return &req.SamplingFields }
func (req *ChatCompletionRequest) job(s *Server, extID string) (*job, *Error) {
	return s.chatJob(req, extID)
}
func (req *ChatCompletionRequest) idPrefix() string { return "chatcmpl-" }
func (req *ChatCompletionRequest) logprobsOut() logprobsOut {
	return logprobsOut{on: req.Logprobs, asIDs: boolOr(req.ReturnTokensAsTokenIDs, false)}
}
func (req *ChatCompletionRequest) stream(s *Server, w http.ResponseWriter, r *http.Request, run *run, meta responseMeta, includeUsage bool, lp logprobsOut) {
	s.streamChat(w, r, run, meta, includeUsage, lp)
}
func (req *ChatCompletionRequest) complete(s *Server, w http.ResponseWriter, r *http.Request, run *run, meta responseMeta, lp logprobsOut) {
	s.completeChat(w, r, run, meta, lp)
}

// chatJob validates a chat request and renders and tokenizes its prompt.
func (s *Server) chatJob(req *ChatCompletionRequest, extID string) (*job, *Error) {
	if err := s.checkModel(req.Model); err != nil {
		return nil, err
	}
	if req.TopLogprobs != nil {
		if *req.TopLogprobs < 0 || *req.TopLogprobs > maxTopLogprobs {
			return nil, BadRequest("top_logprobs", "top_logprobs must be between 0 and %d, got %d", maxTopLogprobs, *req.TopLogprobs)
		}
		if *req.TopLogprobs > 0 && !req.Logprobs {
			return nil, BadRequest("top_logprobs", "top_logprobs needs logprobs set to true")
		}
	}
	params, err := buildParams(&req.SamplingFields, s.cfg.Defaults)
	if err != nil {
		return nil, err
	}
	if req.Logprobs {
		params.Logprobs = 0
		if req.TopLogprobs != nil {
			params.Logprobs = *req.TopLogprobs
		}
	}
	kv, err := s.kvTransfer(&req.SamplingFields)
	if err != nil {
		return nil, err
	}
	choices, err := choicesPerPrompt(&req.SamplingFields, kv)
	if err != nil {
		return nil, err
	}
	text, err := s.renderChat(req.Messages, boolOr(req.AddGenerationPrompt, true), req.ChatTemplate)
	if err != nil {
		return nil, err
	}
	// The template supplies the special tokens (BOS included) itself, so
	// encoding adds none, as vLLM does for chat.
	ids, err := s.encodePrompt(text, false, "messages")
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, BadRequest("messages", "the rendered chat prompt is empty")
	}
	maxTokens, param := req.MaxCompletionTokens, "max_completion_tokens"
	if maxTokens == nil {
		maxTokens, param = req.MaxTokens, "max_tokens"
	}
	n, err := resolveMaxTokens(maxTokens, param, 0, s.cfg.Defaults, len(ids), s.cfg.Backend.MaxModelLen(), "messages")
	if err != nil {
		return nil, err
	}
	params.MaxTokens = n
	if err := validateParams(&params, s.cfg.Tokenizer.VocabSize()); err != nil {
		return nil, err
	}
	return &job{extID: extID, prompts: [][]int32{ids}, params: []sample.Params{params}, n: choices, kv: kv}, nil
}

func (s *Server) completeChat(w http.ResponseWriter, r *http.Request, run *run, meta responseMeta, lp logprobsOut) {
	st, err, ok := s.collect(r, run, lp, true)
	if !ok {
		return
	}
	if err != nil {
		WriteError(w, err)
		return
	}
	resp := ChatCompletionResponse{
		ID: meta.id, Object: "chat.completion", Created: meta.created, Model: meta.model,
		Usage:            &Usage{},
		KVTransferParams: st[0].final.KVTransfer,
	}
	setTiming(w.Header(), st[0].timing, run.api)
	for i := range st {
		c := &st[i]
		choice := ChatChoice{
			Index:        i,
			Message:      ChatReply{Role: "assistant", Content: c.text.String()},
			FinishReason: finishReason(c.final.Finish),
			StopReason:   stopReason(c.final),
		}
		if lp.on {
			choice.Logprobs = &ChatLogprobs{Content: c.chat}
			if choice.Logprobs.Content == nil {
				choice.Logprobs.Content = []ChatTokenLogprob{}
			}
		}
		resp.Choices = append(resp.Choices, choice)
		run.addUsage(resp.Usage, i, c.final.Usage)
	}
	s.writeAnswer(w, r, run, resp)
}

// streamChat streams a chat completion. As in vLLM, the first chunks give
// every choice its role, then each choice's deltas and finish follow in the
// order the engine produces them, each chunk naming its choice's index.
func (s *Server) streamChat(w http.ResponseWriter, r *http.Request, run *run, meta responseMeta, includeUsage bool, lp logprobsOut) {
	chunk := func(c ChatChunkChoice) ChatCompletionChunk {
		ch := ChatCompletionChunk{ID: meta.id, Object: "chat.completion.chunk", Created: meta.created, Model: meta.model, Choices: []ChatChunkChoice{c}}
		if includeUsage {
			ch.Usage = nullJSON
		}
		return ch
	}
	n := run.j.choices()
	sw := NewSSEWriter(w, s.cfg.WriteTimeout)
	var usage Usage
	finals := 0
	for finals < n {
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
			empty := ""
			for i := range n {
				if sw.Data(chunk(ChatChunkChoice{Index: i, Delta: ChatDelta{Role: "assistant", Content: &empty}})) != nil {
					return
				}
			}
		}
		if ev.Text != "" || len(ev.Logprobs) > 0 {
			text := ev.Text
			c := ChatChunkChoice{Index: ie.i, Delta: ChatDelta{Content: &text}}
			if lp.on {
				c.Logprobs = &ChatLogprobs{Content: s.chatLogprobs(ev.Logprobs, lp.asIDs)}
			}
			if sw.Data(chunk(c)) != nil {
				return
			}
		}
		if ev.Finish != engine.FinishNone {
			finals++
			run.addUsage(&usage, ie.i, ev.Usage)
			ch := chunk(ChatChunkChoice{Index: ie.i, FinishReason: finishReason(ev.Finish), StopReason: stopReason(ev)})
			if ie.i == 0 {
				ch.KVTransferParams = ev.KVTransfer
			}
			if sw.Data(ch) != nil {
				return
			}
		}
	}
	s.endStream(w, r, sw, finals == n, includeUsage, usage, func(u json.RawMessage) any {
		return ChatCompletionChunk{ID: meta.id, Object: "chat.completion.chunk", Created: meta.created, Model: meta.model, Choices: []ChatChunkChoice{}, Usage: u}
	})
}
