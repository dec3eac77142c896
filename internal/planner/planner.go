package planner

// The Planner: its state, New and its configuration with the defaults
// applied.

import "time"

// Planner is the pure decision logic: observations in, a Decision out.
// It is not safe for concurrent use; the caller serialises its calls.
type Planner struct {
	cfg  Config
	reqs []Request
	// win is the part of reqs the model is fitted to (view); mixFrom is
	// when the last shift of the traffic mix was seen, and mixWhy how.
	win     []Request
	mixFrom time.Time
	mixWhy  string
	lastDir int // the last change's direction: +1 toward prefill, -1 toward decode
	// pinPrefill and pinDecode are the engines of each pool that cannot
	// move (SetPinned).
	pinPrefill, pinDecode int
	// arrivals are the arrival times (Request.At only) of the last
	// dispersionWindows windows, which the arrivals' burstiness is
	// measured over.
	arrivals []Request
	// seq numbers the requests observed; ids maps the window's request ids
	// still running to theirs.
	seq uint64
	ids map[string]uint64
	// lastPoints are each engine's last decode points (samples with an
	// ITL), kept beyond the window for when it is idle.
	lastPoints map[string][]EngineSample
	samples    []EngineSample
	// prefills are the measured prefills (ObservePrefill), oldest first.
	prefills   []PrefillSample
	prefill    int
	threshold  int
	lastChange time.Time
	// applied is when the caller said the last change took effect
	// (Applied; Config.ReportsApplied).
	applied time.Time
	// thChange is when the threshold last changed, thDir which way (+1
	// up) and thSplit the prefill engines it was chosen for.
	thChange       time.Time
	thDir, thSplit int
}

// New returns a Planner whose split starts at cfg.Prefill prefill engines.
func New(cfg Config) (*Planner, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Planner{cfg: cfg, prefill: cfg.Prefill, threshold: cfg.Threshold}, nil
}

// Config is the planner's configuration with its defaults applied.
func (pl *Planner) Config() Config { return pl.cfg }
