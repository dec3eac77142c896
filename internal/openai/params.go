package openai

import (
	"errors"
	"math"
	"strconv"

	"github.com/tandem-serve/tandem/internal/kvparams"
	"github.com/tandem-serve/tandem/internal/sample"
)

// Defaults are the sampling defaults of the model's generation_config.json.
// A nil field was absent there; the request's own value always wins, and
// OpenAI's default applies where neither sets a field. This is vLLM's
// behaviour (its "generation_config=auto").
type Defaults struct {
	Temperature       *float64
	TopP              *float64
	TopK              *int
	MinP              *float64
	RepetitionPenalty *float64
	// MaxNewTokens caps the default max_tokens when the request sets none.
	MaxNewTokens *int
}

// completionsDefaultMaxTokens is OpenAI's max_tokens default for
// /v1/completions.
const completionsDefaultMaxTokens = 16

// maxTopLogprobs is the largest logprobs / top_logprobs a request may ask for.
const maxTopLogprobs = sample.MaxLogprobs

// MaxN is the largest n a request may ask for. vLLM sets no limit; each
// choice is an engine request holding KV blocks, so Tandem caps it.
const MaxN = 128

// choicesPerPrompt checks n and best_of and returns the number of choices
// per prompt.
func choicesPerPrompt(f *SamplingFields, kv *kvparams.Params) (int, *Error) {
	n := 1
	if f.N != nil {
		n = *f.N
	}
	if n < 1 || n > MaxN {
		return 0, BadRequest("n", "n must be between 1 and %d, got %d", MaxN, n)
	}
	if f.BestOf != nil && *f.BestOf != n {
		return 0, BadRequest("best_of", "best_of must equal n (%d), got %d: Tandem, like vLLM v1, does not generate extra samples to rank; ask for n choices instead", n, *f.BestOf)
	}
	// A prefill leg (do_remote_decode) computes the prompt's KV for a
	// decode engine, which samples the n choices; its own one token is
	// thrown away. The proxy sends such legs with n = 1; an n > 1 from
	// another proxy is served as n = 1 rather than sampling choices no one
	// reads (and holding KV for each of them).
	if kv != nil && kv.DoRemoteDecode {
		n = 1
	}
	return n, nil
}

// buildParams turns the shared request fields into sampling parameters,
// filling in defaults, and checks the API-level rules that sample.Validate
// does not cover. MaxTokens and Logprobs are set by the caller later.
func buildParams(f *SamplingFields, d Defaults) (sample.Params, *Error) {
	var p sample.Params
	if f.StreamOptions != nil && !f.Stream {
		return p, BadRequest("stream_options", "stream_options can only be set when stream is true")
	}
	if f.SkipSpecialTokens != nil && !*f.SkipSpecialTokens {
		p.KeepSpecialTokens = true
	}

	temperature := firstOf(f.Temperature, d.Temperature, 1)
	topP := firstOf(f.TopP, d.TopP, 1)
	minP := firstOf(f.MinP, d.MinP, 0)
	rep := firstOf(f.RepetitionPenalty, d.RepetitionPenalty, 1)
	if topP <= 0 || topP > 1 || math.IsNaN(topP) {
		return p, BadRequest("top_p", "top_p must be in (0, 1], got %v", topP)
	}
	if rep <= 0 || math.IsNaN(rep) {
		return p, BadRequest("repetition_penalty", "repetition_penalty must be > 0, got %v", rep)
	}
	p.Temperature = float32(temperature)
	p.TopP = float32(topP)
	p.MinP = float32(minP)
	p.RepetitionPenalty = float32(rep)
	switch {
	case f.TopK != nil:
		p.TopK = *f.TopK
	case d.TopK != nil:
		p.TopK = *d.TopK
	}
	if f.Seed != nil {
		p.Seed, p.HasSeed = uint64(*f.Seed), true
	}
	if f.PresencePenalty != nil {
		p.PresencePenalty = float32(*f.PresencePenalty)
	}
	if f.FrequencyPenalty != nil {
		p.FrequencyPenalty = float32(*f.FrequencyPenalty)
	}
	if len(f.LogitBias) > 0 {
		p.LogitBias = make(map[int32]float32, len(f.LogitBias))
		for k, v := range f.LogitBias {
			id, err := strconv.ParseInt(k, 10, 32)
			if err != nil {
				return p, BadRequest("logit_bias", "logit_bias keys must be token ids, got %q", k)
			}
			p.LogitBias[int32(id)] = float32(v)
		}
	}
	if f.MinTokens != nil {
		p.MinTokens = *f.MinTokens
	}
	stop, err := parseStop(f.Stop)
	if err != nil {
		return p, err
	}
	p.Stop = stop
	p.StopTokenIDs = f.StopTokenIDs
	p.IgnoreEOS = f.IgnoreEOS
	p.IncludeStopStrInOutput = f.IncludeStopStrInOutput
	p.Logprobs = -1
	return p, nil
}

func firstOf(req, def *float64, fallback float64) float64 {
	if req != nil {
		return *req
	}
	if def != nil {
		return *def
	}
	return fallback
}

// resolveMaxTokens decides a prompt's max_tokens and checks it against the
// context window. requested is the request's value (nil when absent);
// fallback is the endpoint's default (0 means "the rest of the context").
func resolveMaxTokens(requested *int, param string, fallback int, d Defaults, promptLen, maxModelLen int, promptParam string) (int, *Error) {
	if promptLen >= maxModelLen {
		return 0, BadRequest(promptParam, "This model's maximum context length is %d tokens, but the prompt has %d tokens, which leaves no room for a completion. Shorten the prompt.", maxModelLen, promptLen)
	}
	room := maxModelLen - promptLen
	if requested != nil {
		n := *requested
		if n < 1 {
			return 0, BadRequest(param, "%s must be at least 1, got %d", param, n)
		}
		if n > room {
			return 0, BadRequest(param, "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d in the completion). Reduce the length of the prompt or of the completion.", maxModelLen, promptLen+n, promptLen, n)
		}
		return n, nil
	}
	n := room
	if fallback > 0 {
		n = min(n, fallback)
	}
	if d.MaxNewTokens != nil && *d.MaxNewTokens > 0 {
		n = min(n, *d.MaxNewTokens)
	}
	return n, nil
}

// validateParams runs sample.Validate and turns its error into a 400.
func validateParams(p *sample.Params, vocab int) *Error {
	err := sample.Validate(p, vocab)
	if err == nil {
		return nil
	}
	if pe, ok := errors.AsType[*sample.ParamError](err); ok {
		return BadRequest(pe.Param, "%s %s", pe.Param, pe.Message)
	}
	return BadRequest("", "%v", err)
}
