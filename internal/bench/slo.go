package bench

import (
	"slices"
	"time"
)

// SLO is a pair (or triple) of latency objectives a request must all meet
// to count towards goodput. A zero field is not checked.
type SLO struct {
	// TTFT bounds the time to the first token.
	TTFT time.Duration `json:"ttft_ns,omitempty"`
	// TPOT bounds the mean time per output token after the first.
	TPOT time.Duration `json:"tpot_ns,omitempty"`
	// ITL bounds every single gap between tokens. TPOT is a mean, so a
	// server could meet it while stalling a stream for seconds (or, the
	// other way round, delay early tokens to look smooth); this catches the
	// stalls. See "Revisiting SLO and Goodput Metrics in LLM Serving".
	ITL time.Duration `json:"itl_ns,omitempty"`
}

// Set says whether any objective is given.
func (s SLO) Set() bool { return s.TTFT > 0 || s.TPOT > 0 || s.ITL > 0 }

// Scale returns s with every objective multiplied by f.
func (s SLO) Scale(f float64) SLO {
	m := func(d time.Duration) time.Duration { return time.Duration(float64(d) * f) }
	return SLO{TTFT: m(s.TTFT), TPOT: m(s.TPOT), ITL: m(s.ITL)}
}

// Met says whether a finished request met s. A failed request never does:
// dropping the hard requests must not raise goodput.
func (s SLO) Met(r *Record) bool {
	if r.Err != "" {
		return false
	}
	if s.TTFT > 0 && r.TTFT > s.TTFT {
		return false
	}
	if s.TPOT > 0 && r.tpot() > s.TPOT {
		return false
	}
	if s.ITL > 0 && len(r.ITL) > 0 && slices.Max(r.ITL) > s.ITL {
		return false
	}
	return true
}

// Attainment is the fraction of records (failed ones included, as misses)
// that met s, and how many did.
func Attainment(s SLO, records []Record) (frac float64, met int) {
	for i := range records {
		if s.Met(&records[i]) {
			met++
		}
	}
	if len(records) == 0 {
		return 0, 0
	}
	return float64(met) / float64(len(records)), met
}

// SLOScales are the factors the attainment curve is reported at: goodput
// at one SLO says little on its own (it can be tuned to flatter either
// side), so every report shows how attainment moves as the SLO tightens and
// loosens, as DistServe's SLO-scale sweeps do.
var SLOScales = []float64{0.25, 0.5, 1, 2, 4}

// CurvePoint is the attainment at one SLO scale.
type CurvePoint struct {
	Scale      float64 `json:"scale"`
	Attainment float64 `json:"attainment"`
}
