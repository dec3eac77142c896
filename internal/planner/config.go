package planner

// The planner's configuration (Config) and its defaults.

import (
	"errors"
	"fmt"
	"time"
)

// Config configures a Planner. Zero values take the defaults on each field.
type Config struct {
	// TTFT and TPOT are the objectives. Both are required.
	TTFT, TPOT time.Duration
	// Goal is the fraction of requests that must meet both. Default 0.9.
	Goal float64
	// Engines is how many engines the split divides. Required, at least
	// MinPrefill + MinDecode and 2.
	Engines int
	// Prefill is the split's prefill engines at start (the rest decode).
	// Default MinPrefill.
	Prefill int
	// MinPrefill and MinDecode bound the split. MinPrefill defaults to 0:
	// the split may be colocated, every engine a decode prefilling its own
	// prompts (the router must then keep every prompt local with no
	// prefill engine, as the conditional decider does); set 1 to keep a
	// prefill pool. MinDecode defaults to 1.
	MinPrefill, MinDecode int
	// MaxSeqs is the decode engines' --max-num-seqs. Default 64.
	MaxSeqs int
	// MaxBatchedTokens is the decode engines' --max-num-batched-tokens,
	// the chunk their local prefills are computed in. Default 2048 (tandem
	// serve's).
	MaxBatchedTokens int
	// Window is how far back requests and engine samples are fitted.
	// Default 60s.
	Window time.Duration
	// MaxAge is the age beyond which an engine's scraped costs are stale
	// and ignored. Default 10s.
	MaxAge time.Duration
	// MinDwell is the least time between two changes of the split, and
	// StepDwell between two in the same direction (the split still moving
	// toward one best: no flapping). Defaults 30s and MinDwell/4. The
	// conditional threshold has the same dwells of its own at one split.
	MinDwell, StepDwell time.Duration
	// ReportsApplied says the caller tells when a change of the split took
	// effect (Planner.Applied: the engines switched pools): the split then
	// moves again only once the requests since then are most of a window
	// (settle.go), and not before it is told. Without it a change counts
	// from its decision.
	ReportsApplied bool
	// Hysteresis is how much more goodput (a fraction) the model must
	// predict for a new split than for the current one before it moves,
	// and for a new threshold than for the current one at the split that
	// runs. Default 0.1.
	Hysteresis float64
	// MinRequests is the fewest requests in the window a decision is made
	// from. Default 20.
	MinRequests int
	// Threshold is the conditional decider's threshold at start (uncached
	// prompt tokens from which a prefill is remote). Default 256;
	// MinThreshold and MaxThreshold bound the chosen one (default 16 and
	// 4096).
	Threshold, MinThreshold, MaxThreshold int
	// MaxCadence bounds the prefill cadence chosen. Default 8.
	MaxCadence int
}

func (c *Config) setDefaults() error {
	if c.TTFT <= 0 || c.TPOT <= 0 {
		return errors.New("planner: both objectives are needed: set --slo-ttft and --slo-tpot")
	}
	if c.Goal <= 0 || c.Goal >= 1 {
		c.Goal = 0.9
	}
	c.MinPrefill, c.MinDecode = max(c.MinPrefill, 0), max(c.MinDecode, 1)
	if c.Engines < max(c.MinPrefill+c.MinDecode, 2) {
		return fmt.Errorf("planner: %d engines cannot be split into at least %d prefill and %d decode: start more engines", c.Engines, c.MinPrefill, c.MinDecode)
	}
	c.Prefill = min(max(c.Prefill, c.MinPrefill), c.Engines-c.MinDecode)
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Window, time.Minute)
	def(&c.MaxAge, 10*time.Second)
	def(&c.MinDwell, 30*time.Second)
	def(&c.StepDwell, c.MinDwell/4)
	defInt := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defInt(&c.MaxSeqs, 64)
	defInt(&c.MaxBatchedTokens, 2048)
	defInt(&c.MinRequests, 20)
	defInt(&c.Threshold, 256)
	defInt(&c.MinThreshold, 16)
	defInt(&c.MaxThreshold, 4096)
	defInt(&c.MaxCadence, 8)
	if c.Hysteresis <= 0 {
		c.Hysteresis = 0.1
	}
	return nil
}
