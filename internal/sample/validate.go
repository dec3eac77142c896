package sample

import (
	"fmt"
	"math"
)

// ParamError is an invalid sampling parameter. Param is the OpenAI request
// field name (for example "top_p"), so the API layer can report it in the
// error object's "param" member.
type ParamError struct {
	Param   string
	Message string
}

// Error returns the message, prefixed with the parameter name.
func (e *ParamError) Error() string { return e.Param + ": " + e.Message }

// Logprob and bias limits, as in vLLM and the OpenAI API.
const (
	// MaxLogprobs is the largest number of alternatives per token.
	MaxLogprobs = 20
	// MaxLogitBias is the largest magnitude of a logit_bias value.
	MaxLogitBias = 100
	// MaxPenalty is the largest magnitude of presence and frequency penalties.
	MaxPenalty = 2
)

// Validate checks p against the ranges vLLM accepts and returns the first
// problem as a *ParamError, or nil. vocab bounds token ids in logit_bias and
// stop_token_ids; vocab <= 0 skips those range checks.
//
// Params uses 0 for "off" in TopP, TopK and RepetitionPenalty, so Validate
// accepts 0 there; an API layer that wants to reject an explicit top_p of 0
// (as vLLM does) must do so on the request value, before filling Params.
// MaxTokens must already hold the resolved limit (at least 1).
func Validate(p *Params, vocab int) error {
	if p == nil {
		return &ParamError{"max_tokens", "sampling parameters are missing"}
	}
	bad := func(param, format string, args ...any) error {
		return &ParamError{param, fmt.Sprintf(format, args...)}
	}
	finite := func(v float32) bool { return !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) }

	if !finite(p.Temperature) || p.Temperature < 0 {
		return bad("temperature", "must be a number >= 0, got %v", p.Temperature)
	}
	if !finite(p.TopP) || p.TopP < 0 || p.TopP > 1 {
		return bad("top_p", "must be in (0, 1], got %v", p.TopP)
	}
	if p.TopK < -1 {
		return bad("top_k", "must be -1 or 0 (disabled) or at least 1, got %d", p.TopK)
	}
	if !finite(p.MinP) || p.MinP < 0 || p.MinP > 1 {
		return bad("min_p", "must be in [0, 1], got %v", p.MinP)
	}
	if !finite(p.RepetitionPenalty) || p.RepetitionPenalty < 0 {
		return bad("repetition_penalty", "must be > 0, got %v", p.RepetitionPenalty)
	}
	if !finite(p.PresencePenalty) || p.PresencePenalty < -MaxPenalty || p.PresencePenalty > MaxPenalty {
		return bad("presence_penalty", "must be in [-2, 2], got %v", p.PresencePenalty)
	}
	if !finite(p.FrequencyPenalty) || p.FrequencyPenalty < -MaxPenalty || p.FrequencyPenalty > MaxPenalty {
		return bad("frequency_penalty", "must be in [-2, 2], got %v", p.FrequencyPenalty)
	}
	if p.Logprobs < -1 || p.Logprobs > MaxLogprobs {
		return bad("logprobs", "must be between 0 and %d, got %d", MaxLogprobs, p.Logprobs)
	}
	for id, b := range p.LogitBias {
		if id < 0 || (vocab > 0 && int(id) >= vocab) {
			return bad("logit_bias", "token id %d is outside the vocabulary [0, %d)", id, vocab)
		}
		if !finite(b) || b < -MaxLogitBias || b > MaxLogitBias {
			return bad("logit_bias", "bias for token %d must be in [-100, 100], got %v", id, b)
		}
	}
	if p.MaxTokens < 1 {
		return bad("max_tokens", "must be at least 1, got %d", p.MaxTokens)
	}
	if p.MinTokens < 0 {
		return bad("min_tokens", "must be >= 0, got %d", p.MinTokens)
	}
	if p.MinTokens > p.MaxTokens {
		return bad("min_tokens", "must be <= max_tokens (%d), got %d", p.MaxTokens, p.MinTokens)
	}
	for _, id := range p.StopTokenIDs {
		if id < 0 || (vocab > 0 && int(id) >= vocab) {
			return bad("stop_token_ids", "token id %d is outside the vocabulary [0, %d)", id, vocab)
		}
	}
	for i, s := range p.Stop {
		if s == "" {
			return bad("stop", "stop string %d is empty", i)
		}
	}
	return nil
}
