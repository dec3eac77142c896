package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/tandem-serve/tandem/internal/server"
	"github.com/tandem-serve/tandem/internal/sim"
)

// simConfig is the flags of a simulated engine (`tandem serve --simulate`):
// the engine is real, its forward pass is internal/sim's.
type simConfig struct {
	Simulate simulateFlag

	TTFT, ITL, PrefillPerToken time.Duration
	Speed                      float64
	Seed                       uint64
	MeanOutputLen              int

	ErrorRate                 float64
	StallEvery, StallFor      time.Duration
	KVDelay                   time.Duration
	KVFailRate, KVCorruptRate float64
	CrashAfter                int

	set map[string]bool // the --sim-* flags given
}

// simulateFlag is --simulate: alone, the built-in time model; with a value
// (--simulate=PROFILE.json, or --simulate PROFILE.json, see
// joinSimulateArg), a profile written by `tandem profile`.
type simulateFlag string

const simBuiltin = "builtin"

func (f *simulateFlag) String() string { return string(*f) }

func (f *simulateFlag) Set(s string) error {
	switch s {
	case "true":
		*f = simBuiltin
	case "false":
		*f = ""
	default:
		*f = simulateFlag(s)
	}
	return nil
}

func (f *simulateFlag) IsBoolFlag() bool { return true }

// joinSimulateArg lets --simulate take a profile as the next argument, as
// `--simulate PROFILE.json`, although the flag may also stand alone: a
// following argument that ends in .json is its value. It stops at "--".
func joinSimulateArg(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if (a == "--simulate" || a == "-simulate") && i+1 < len(args) && strings.HasSuffix(args[i+1], ".json") && !strings.HasPrefix(args[i+1], "-") {
			out = append(out, a+"="+args[i+1])
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

func (c *simConfig) register(fs *flag.FlagSet) {
	fs.Var(&c.Simulate, "simulate", "simulate the model: a real engine (API, scheduler, KV cache, P/D transfer) whose forward pass sleeps for a time model's step time and writes a checkable pattern into the KV cache. Alone: the built-in time model (a 135M model measured on a 2-core EPYC); --simulate PROFILE.json (or --simulate=FILE): a profile from tandem profile. --model gives the tokenizer, chat template and vocabulary (default: the embedded model's)")
	fs.DurationVar(&c.TTFT, "sim-ttft", 0, "simple time model instead of a profile: a step that runs prompt tokens costs this, plus --sim-prefill-per-token each")
	fs.DurationVar(&c.ITL, "sim-itl", 0, "simple time model: a step that runs decodes costs this (inter-token latency)")
	fs.DurationVar(&c.PrefillPerToken, "sim-prefill-per-token", 0, "simple time model: the cost of each prompt token in a step")
	fs.Float64Var(&c.Speed, "sim-speed", 1, "run simulated time this many times faster than real time")
	fs.Uint64Var(&c.Seed, "sim-seed", 0, "the simulated model's seed: engines that must give the same answers need the same one")
	fs.IntVar(&c.MeanOutputLen, "sim-mean-output-len", 128, "the simulated model ends an answer with EOS after this many tokens on average (0: never, answers run to max_tokens)")
	fs.Float64Var(&c.ErrorRate, "sim-error-rate", 0, "fault: fraction of requests that fail (HTTP 500) when their prompt is computed")
	fs.DurationVar(&c.StallEvery, "sim-stall-every", 0, "fault: freeze the step loop for --sim-stall-for once per this much time")
	fs.DurationVar(&c.StallFor, "sim-stall-for", time.Second, "fault: how long a --sim-stall-every stall lasts")
	fs.DurationVar(&c.KVDelay, "sim-kv-delay", 0, "fault: every KV load (pull from a prefill) finishes this much later")
	fs.Float64Var(&c.KVFailRate, "sim-kv-fail-rate", 0, "fault: fraction of KV loads that fail (handled by --kv-load-failure-policy)")
	fs.Float64Var(&c.KVCorruptRate, "sim-kv-corrupt-rate", 0, "fault: fraction of KV loads with a damaged byte, which the KV pattern check catches (handled by --kv-load-failure-policy)")
	fs.IntVar(&c.CrashAfter, "sim-crash-after", 0, "fault: exit abruptly (status 70) when request N+1 starts")
}

// validate checks the --sim-* flags given in fs.
func (c *simConfig) validate(fs *flag.FlagSet) error {
	c.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "sim-") {
			c.set[f.Name] = true
		}
	})
	if c.Simulate == "" {
		for name := range c.set {
			return fmt.Errorf("--%s needs --simulate", name)
		}
		return nil
	}
	knobs := c.set["sim-ttft"] || c.set["sim-itl"] || c.set["sim-prefill-per-token"]
	switch {
	case knobs && c.Simulate != simBuiltin:
		return fmt.Errorf("--simulate %s and --sim-ttft/--sim-itl/--sim-prefill-per-token are two time models: give one", c.Simulate)
	case c.TTFT < 0 || c.ITL < 0 || c.PrefillPerToken < 0:
		return errors.New("--sim-ttft, --sim-itl and --sim-prefill-per-token must not be negative")
	case !(c.Speed > 0):
		return fmt.Errorf("--sim-speed %v must be positive", c.Speed)
	case c.MeanOutputLen < 0:
		return errors.New("--sim-mean-output-len must not be negative")
	}
	return nil
}

// simulation is the server's simulation the flags describe, nil without
// --simulate.
func (c *simConfig) simulation() *server.Simulation {
	if c.Simulate == "" {
		return nil
	}
	s := &server.Simulation{
		Speed: c.Speed, Seed: c.Seed, MeanOutputLen: c.MeanOutputLen,
		Faults: sim.Faults{
			ErrorRate: c.ErrorRate, StallEvery: c.StallEvery, StallFor: c.StallFor,
			KVDelay: c.KVDelay, KVFailRate: c.KVFailRate, KVCorruptRate: c.KVCorruptRate, CrashAfter: c.CrashAfter,
		},
	}
	if c.Simulate != simBuiltin {
		s.Profile = string(c.Simulate)
	}
	if c.set["sim-ttft"] || c.set["sim-itl"] || c.set["sim-prefill-per-token"] {
		s.Knobs = &sim.Knobs{TTFT: c.TTFT, ITL: c.ITL, PrefillPerToken: c.PrefillPerToken}
	}
	return s
}
