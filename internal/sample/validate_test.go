package sample

import (
	"errors"
	"math"
	"testing"
)

func TestValidate(t *testing.T) {
	ok := func(f func(p *Params)) *Params {
		p := &Params{Temperature: 1, MaxTokens: 16, Logprobs: -1}
		f(p)
		return p
	}
	nan := float32(math.NaN())
	tests := []struct {
		name      string
		p         *Params
		wantParam string // "" means valid
	}{
		{"defaults are valid", ok(func(p *Params) {}), ""},
		{"a full set of in-range values is valid", ok(func(p *Params) {
			p.Temperature, p.TopK, p.TopP, p.MinP = 2.5, 40, 0.9, 0.05
			p.RepetitionPenalty, p.PresencePenalty, p.FrequencyPenalty = 1.1, -2, 2
			p.LogitBias = map[int32]float32{0: -100, 99: 100}
			p.MinTokens, p.MaxTokens, p.Logprobs = 16, 16, 20
			p.StopTokenIDs, p.Stop = []int32{0, 99}, []string{"\n\n", "END"}
		}), ""},
		{"top_k -1 means off", ok(func(p *Params) { p.TopK = -1 }), ""},
		{"top_p 0 means off in Params", ok(func(p *Params) { p.TopP = 0 }), ""},
		{"logprobs 0 asks for the chosen token only", ok(func(p *Params) { p.Logprobs = 0 }), ""},
		{"nil params", nil, "max_tokens"},
		{"negative temperature", ok(func(p *Params) { p.Temperature = -0.1 }), "temperature"},
		{"NaN temperature", ok(func(p *Params) { p.Temperature = nan }), "temperature"},
		{"top_p above 1", ok(func(p *Params) { p.TopP = 1.01 }), "top_p"},
		{"negative top_p", ok(func(p *Params) { p.TopP = -0.5 }), "top_p"},
		{"top_k below -1", ok(func(p *Params) { p.TopK = -2 }), "top_k"},
		{"min_p above 1", ok(func(p *Params) { p.MinP = 1.5 }), "min_p"},
		{"negative repetition_penalty", ok(func(p *Params) { p.RepetitionPenalty = -1 }), "repetition_penalty"},
		{"infinite repetition_penalty", ok(func(p *Params) { p.RepetitionPenalty = float32(math.Inf(1)) }), "repetition_penalty"},
		{"presence_penalty above 2", ok(func(p *Params) { p.PresencePenalty = 2.5 }), "presence_penalty"},
		{"frequency_penalty below -2", ok(func(p *Params) { p.FrequencyPenalty = -2.01 }), "frequency_penalty"},
		{"logprobs above 20", ok(func(p *Params) { p.Logprobs = 21 }), "logprobs"},
		{"logprobs below -1", ok(func(p *Params) { p.Logprobs = -2 }), "logprobs"},
		{"logit_bias key outside the vocabulary", ok(func(p *Params) { p.LogitBias = map[int32]float32{100: 1} }), "logit_bias"},
		{"negative logit_bias key", ok(func(p *Params) { p.LogitBias = map[int32]float32{-1: 1} }), "logit_bias"},
		{"logit_bias value above 100", ok(func(p *Params) { p.LogitBias = map[int32]float32{3: 101} }), "logit_bias"},
		{"max_tokens 0", ok(func(p *Params) { p.MaxTokens = 0 }), "max_tokens"},
		{"negative min_tokens", ok(func(p *Params) { p.MinTokens = -1 }), "min_tokens"},
		{"min_tokens above max_tokens", ok(func(p *Params) { p.MinTokens = 17 }), "min_tokens"},
		{"stop_token_ids outside the vocabulary", ok(func(p *Params) { p.StopTokenIDs = []int32{5, 100} }), "stop_token_ids"},
		{"an empty stop string", ok(func(p *Params) { p.Stop = []string{"a", ""} }), "stop"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.p, 100)
			if tc.wantParam == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			var pe *ParamError
			if !errors.As(err, &pe) {
				t.Fatalf("Validate = %v, want a *ParamError for %q", err, tc.wantParam)
			}
			if pe.Param != tc.wantParam || pe.Message == "" {
				t.Errorf("Validate = %+v, want param %q with a message", pe, tc.wantParam)
			}
		})
	}
}

func TestValidateWithoutVocabSkipsIDRanges(t *testing.T) {
	p := &Params{MaxTokens: 1, LogitBias: map[int32]float32{1 << 20: 1}, StopTokenIDs: []int32{1 << 20}}
	if err := Validate(p, 0); err != nil {
		t.Errorf("Validate(vocab 0) = %v, want nil", err)
	}
}
