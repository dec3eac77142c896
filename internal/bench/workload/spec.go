package workload

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// Spec chooses a workload as `tandem bench`'s workload flags do; errors
// name those flags.
type Spec struct {
	// Kind is fixed, chat, long, prefix, multiturn or trace:FILE.
	Kind     string
	Requests int
	// PromptTokens and MaxTokens are the fixed workload's lengths.
	PromptTokens, MaxTokens int
	// Input and Output are length distributions (ParseDist) that replace
	// the kind's own; empty keeps them.
	Input, Output string
	// PrefixGroups and PrefixTokens shape the prefix workload.
	PrefixGroups, PrefixTokens int
	// Turns and Think are the multiturn workload's distributions.
	Turns, Think string
	// TraceBlock, TraceSpeed and TraceLimit are a trace's TraceOptions
	// (TraceLimit 0 reads every request).
	TraceBlock int
	TraceSpeed float64
	TraceLimit int
	Seed       uint64
	// MaxContext clips requests to this many tokens (Workload.Fit); 0
	// leaves them.
	MaxContext int
}

func distOr(s string, def Dist) (Dist, error) {
	if s == "" {
		return def, nil
	}
	return ParseDist(s)
}

// Build makes the workload s describes with prompt ids from pool.
func (s Spec) Build(pool []int32) (*Workload, error) {
	if s.Requests < 1 {
		return nil, fmt.Errorf("--requests must be at least 1, got %d", s.Requests)
	}
	var w *Workload
	kind, file, _ := strings.Cut(s.Kind, ":")
	defIn, defOut := Fixed(max(s.PromptTokens, 1)), Fixed(max(s.MaxTokens, 1))
	switch kind {
	case "chat":
		defIn, defOut = ChatInput, ChatOutput
	case "long":
		defIn, defOut = LongInput, LongOutput
	}
	in, err := distOr(s.Input, defIn)
	if err != nil {
		return nil, fmt.Errorf("--input: %w", err)
	}
	out, err := distOr(s.Output, defOut)
	if err != nil {
		return nil, fmt.Errorf("--output: %w", err)
	}
	switch kind {
	case "fixed", "chat", "long":
		w = Lengths(kind, s.Seed, s.Requests, in, out, pool)
	case "prefix":
		if w, err = SharedPrefix(s.Seed, s.Requests, s.PrefixGroups, s.PrefixTokens, in, out, pool); err != nil {
			return nil, err
		}
	case "multiturn":
		turns, err := ParseDist(s.Turns)
		if err != nil {
			return nil, fmt.Errorf("--turns: %w", err)
		}
		think, err := ParseDist(s.Think)
		if err != nil {
			return nil, fmt.Errorf("--think: %w", err)
		}
		w = MultiTurn(s.Seed, s.Requests, turns, in, out, think, pool)
	case "trace":
		if file == "" {
			return nil, errors.New("--workload trace:FILE needs a file")
		}
		fh, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		defer fh.Close()
		if w, err = ReadTrace(fh, file, TraceOptions{BlockTokens: s.TraceBlock, Speed: s.TraceSpeed, Limit: s.TraceLimit}, s.Seed, pool); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("--workload %q: want fixed, chat, long, prefix, multiturn or trace:FILE", s.Kind)
	}
	w.Fit(s.MaxContext)
	return w, nil
}
