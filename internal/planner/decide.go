package planner

// Decide: the split, threshold and cadence chosen at each decision from the
// window's fit, what it reports (Decision, Split), how far and how soon the
// split moves (step, dwell), and the bounds on a decision's work.

import (
	"cmp"
	"fmt"
	"time"
)

// Decision is what Decide chose and the numbers behind it.
type Decision struct {
	At time.Time `json:"at"`
	// Prefill and Decode are the split to run now.
	Prefill int `json:"prefill"`
	Decode  int `json:"decode"`
	// Best is the split the model predicts the most goodput for; the
	// current split moves toward it one engine per change (half the way
	// after a shift of the traffic mix). Best.P 0 is the
	// colocated split: every engine a decode prefilling its own prompts.
	Best Split `json:"best"`
	// Threshold is the conditional decider's threshold to use (uncached
	// prompt tokens) while there is a prefill pool; with none every
	// prompt is local.
	Threshold int `json:"threshold_tokens"`
	// PrefillScheduleInterval is the prefill cadence advised for engines
	// that prefill beside their decodes (tandem serve
	// --prefill-schedule-interval).
	PrefillScheduleInterval int `json:"prefill_schedule_interval"`
	// ThresholdHeld says why Threshold stayed where another predicts more
	// goodput at the split that runs ("" when it did not): the threshold's
	// own hysteresis or dwell.
	ThresholdHeld string `json:"threshold_held,omitempty"`
	// Changed says the split changed at this decision.
	Changed bool `json:"changed"`
	// Crossed says the split goes to Best at once, more than one engine,
	// because the step toward it is predicted worse than now (a valley
	// between the colocated split and one with a prefill pool).
	Crossed bool `json:"crossed,omitempty"`
	// Held says why the split did not move to Best ("" when it is Best
	// or moved toward it): too few or stale samples, the dwell, the
	// hysteresis, the window's noise, an uncertain decode fit (the
	// lead the decode step's residual makes, not its curve: uncertainFit),
	// decodes at a batch the step was not measured near (unmeasuredBatch),
	// or the last change not yet measured (settling).
	Held string `json:"held,omitempty"`
	// Settling says why the last change of the split is not yet measured
	// ("" when it is, or a move would go regardless: settle.go): until it
	// is, the split does not move again.
	Settling string `json:"settling,omitempty"`
	// Splits is every split within the bounds, each at the threshold
	// that predicts it the most goodput: what Best was chosen from.
	Splits []Split `json:"splits,omitempty"`
	Fit    Fit     `json:"fit"`
}

// Split is P prefill and D decode engines and the goodput the model
// predicts for them.
type Split struct {
	P       int     `json:"p"`
	D       int     `json:"d"`
	Goodput float64 `json:"goodput_rps"`
	// Limit is the side that bounds it: "prefill" or "decode" (see
	// Fit.DecodeLimit for the decode's objective).
	Limit string `json:"limit,omitempty"`
	// Threshold is the conditional threshold it is valued at, in
	// Decision.Splits (0 for the colocated split, every prompt local).
	Threshold int `json:"threshold_tokens,omitempty"`
}

// Decide refits the model to the window ending at now and returns the
// split, threshold and cadence to run. The split changes only when the
// best split's predicted goodput beats the current one's by
// Config.Hysteresis, Config.MinDwell has passed since the last change
// and that change has been measured (settle.go), by one engine per call,
// half the way after a shift of the traffic mix (or straight to the best
// across a valley, see Decision.Crossed); with too few fresh samples it
// holds. The best split
// may have no prefill engine (the colocated split) unless
// Config.MinPrefill keeps one.
func (pl *Planner) Decide(now time.Time) (d Decision) {
	pl.trim(now)
	d = Decision{At: now, Threshold: pl.threshold, PrefillScheduleInterval: 1}
	f, why := pl.fit(now)
	d.Fit = f
	defer func() { d.Prefill, d.Decode = pl.prefill, pl.cfg.Engines-pl.prefill }()
	if why != "" {
		d.Held, d.Best = why, Split{P: pl.prefill, D: pl.cfg.Engines - pl.prefill}
		return d
	}
	// Where the split is headed: the split with a prefill pool and the
	// threshold that together predict the most goodput (the colocated
	// split, no prefill engine and no threshold, is weighed against it).
	// Each split is valued at the threshold it would run with
	// (threshold.go).
	ths := pl.thresholds(f)
	bounds := pl.bounded()
	bestTh, m, best := ths.best(bounds)
	d.Best = best
	curTh := colocatedThreshold // the threshold the current split is valued at
	if pl.prefill > 0 {
		curTh, m, _ = ths.forSplit(pl.prefill, pl.cfg.Engines-pl.prefill, now)
	}
	var colo *capacity
	if bounds.MinPrefill == 0 {
		colo = pl.model(f, colocatedThreshold)
		if c := colo.split(0, pl.cfg.Engines); c.Goodput >= d.Best.Goodput*(1-1e-9) {
			d.Best, bestTh = c, colocatedThreshold
		}
	}
	for p := bounds.MinPrefill; p <= pl.cfg.Engines-bounds.MinDecode; p++ {
		if p == 0 {
			d.Splits = append(d.Splits, colo.split(0, pl.cfg.Engines))
			continue
		}
		s := Split{Goodput: -1}
		for _, th := range ths.cands {
			if c := ths.model(th).split(p, pl.cfg.Engines-p); c.Goodput > s.Goodput {
				s, s.Threshold = c, th
			}
		}
		d.Splits = append(d.Splits, s)
	}
	running := m // the model of the split running now
	if pl.prefill == 0 && colo != nil {
		running = colo
	}
	d.Fit.Current = running.split(pl.prefill, pl.cfg.Engines-pl.prefill)
	if d.Best.Goodput <= d.Fit.Current.Goodput*(1+1e-9) {
		d.Best = d.Fit.Current
	}
	d.Fit.RemoteFraction = running.remoteFraction
	d.Fit.PrefillSeconds, d.Fit.PrefillCV2, d.Fit.PrefillTooLong = m.s, m.cv2, m.prefillTooLong
	dc := running.decode(pl.prefill, pl.cfg.Engines-pl.prefill)
	d.Fit.DecodeBatch, d.Fit.DecodeTPOT, d.Fit.DecodeRate, d.Fit.DecodeLimit = dc.batch, dc.tpot, dc.rate, dc.limit
	d.Fit.DecodeLeg = running.decodeLeg(d.Fit.Current.Goodput/float64(max(pl.cfg.Engines-pl.prefill, 1)), pl.cfg.Engines-pl.prefill)
	if d.Best.Goodput <= 0 {
		d.Fit.Unattainable = running.unattainable(pl.prefill, pl.cfg.Engines-pl.prefill)
	}
	// The split moves one engine toward Best per change (half the way
	// after a shift of the mix: step), but not where that step is
	// predicted worse than now: the colocated split and the
	// best with a prefill pool may lie on either side of a valley (both
	// better than the splits between), and crossing it engine by engine
	// would lose goodput at every step and hold the split in the valley
	// for a dwell each. Across a valley the split goes to Best at once
	// (the proxy still moves engines one at a time).
	cur := d.Fit.Current.Goodput
	target := d.Best
	next := pl.prefill + pl.step(target.P, f.Shift != "")
	// The step is valued at its own best threshold, as Splits and Best
	// are: the threshold it would run with may be held near the running
	// one by the threshold's hysteresis, and that dip is no valley.
	stepG := -1.0
	if s := split(d.Splits, next); s.D > 0 {
		stepG = s.Goodput
	}
	if stepG < 0 {
		sm := colo
		if next > 0 || colo == nil {
			_, sm, _ = ths.forSplit(next, pl.cfg.Engines-next, now)
		}
		stepG = sm.split(next, pl.cfg.Engines-next).Goodput
	}
	if target.P != pl.prefill && cur > 0 && stepG < cur*(1-1e-9) {
		next, d.Crossed = target.P, true
	}
	var noise string // why the move is within the window's noise
	if target.P != pl.prefill && target.Goodput >= cur*(1+pl.cfg.Hysteresis) && target.Goodput < cur*(1+noiseLeads*pl.cfg.Hysteresis) {
		noise = pl.withinNoise(f, d.Fit.Current, curTh, target, bestTh)
	}
	var uncertain string // why the move's lead is the decode fit's noise
	if noise == "" && target.P != pl.prefill && target.Goodput >= cur*(1+pl.cfg.Hysteresis) {
		uncertain = pl.uncertainFit(f, d.Fit.Current, curTh, target, bestTh)
	}
	var unmeasured string // why the split moved to runs its decodes past the measured batches
	if noise == "" && uncertain == "" && target.P != pl.prefill && target.Goodput >= cur*(1+pl.cfg.Hysteresis) {
		unmeasured = pl.unmeasuredBatch(f, running, d.Fit.Current, splitModel(d.Splits, next, colo, ths), split(d.Splits, next))
	}
	d.Settling = pl.settling(now, f, d.Fit.Current, target)
	switch {
	case target.P == pl.prefill:
	case target.Goodput < cur*(1+pl.cfg.Hysteresis):
		d.Held = fmt.Sprintf("hysteresis: %dP:%dD is predicted %.2f req/s against %.2f now, less than %.0f%% more",
			target.P, target.D, target.Goodput, cur, 100*pl.cfg.Hysteresis)
	case noise != "":
		d.Held = noise
	case uncertain != "":
		d.Held = uncertain
	case unmeasured != "":
		d.Held = unmeasured
	case d.Settling != "":
		d.Held = d.Settling
	case !pl.lastChange.IsZero() && now.Sub(pl.lastChange) < pl.dwell(next):
		d.Held = fmt.Sprintf("dwell: the split changed %v ago, less than %v", now.Sub(pl.lastChange).Round(100*time.Millisecond), pl.dwell(next))
	default:
		pl.lastDir = cmp.Compare(next, pl.prefill)
		pl.prefill = next
		pl.lastChange, d.Changed = now, true
	}
	if !d.Changed {
		d.Crossed = false
	}
	// The threshold for the split that runs from now (with none, every
	// prompt is local and the threshold stays as it is).
	if pl.prefill > 0 {
		th, mt, held := ths.forSplit(pl.prefill, pl.cfg.Engines-pl.prefill, now)
		pl.setThreshold(th, pl.prefill, now)
		running, d.ThresholdHeld = mt, held
	} else if colo != nil {
		running = colo
	}
	d.Threshold = pl.threshold
	d.PrefillScheduleInterval = pl.chooseCadence(f, running)
	return d
}

// step is how many engines the split moves toward best prefill engines
// at one change, signed: one, or after a shift of the traffic mix (the
// split is then far from the new mix's best at once, not drifting toward
// it) half the distance rounded up, so that a split several engines away
// gets there in a few changes rather than one dwell per engine.
func (pl *Planner) step(best int, shifted bool) int {
	dist := best - pl.prefill
	n := 1
	if shifted {
		n = (abs(dist) + 1) / 2
	}
	return min(n, abs(dist)) * cmp.Compare(dist, 0)
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// dwell is the least time since the last change before the split moves to
// next prefill engines: Config.StepDwell when that goes on in the last
// change's direction, Config.MinDwell when it turns back.
func (pl *Planner) dwell(next int) time.Duration {
	if cmp.Compare(next, pl.prefill) == pl.lastDir {
		return pl.cfg.StepDwell
	}
	return pl.cfg.MinDwell
}

// chooseCadence is the prefill cadence advised for engines that prefill
// beside their decodes: 1 (every step) while their TPOT has room, else as
// many steps as a local prompt can wait within its TTFT slack (TTFT
// objective less its own prefill at the threshold), so that prefills are
// gathered into fewer steps and fewer inter-token gaps carry one. At
// the colocated split it is 1: every prompt is local there, of any length
// (the slack at the threshold says nothing of a 2,048-token prompt's four
// chunks, each waiting for its step), and the decodes' inter-token
// latencies the step is fitted to carry those prefills' chunks, so a
// cadence that spread them read as room again and the next decision set
// 1 (the P/D experiment's long mix at 0P:4D: 1 and 8 in turn every ~4 s,
// 92% met at 8 req/s where cadence 1 met 100%).
func (pl *Planner) chooseCadence(f Fit, m *capacity) int {
	tpot := f.stepSeconds()
	if pl.prefill == 0 || m.remoteFraction >= 1 || tpot <= 0 || tpot < 0.8*pl.cfg.TPOT.Seconds() {
		return 1
	}
	slack := pl.cfg.TTFT.Seconds() - f.prefill().Seconds(float64(pl.threshold))
	return min(max(int(slack/tpot), 1), pl.cfg.MaxCadence)
}

// Bounds on a decision's work, whatever the traffic: the model is fitted
// to at most maxModelRequests of the window's requests (evenly spread over
// it), and at most maxThresholds thresholds are tried. A decision then
// costs tens of milliseconds at 32 engines.
const (
	maxModelRequests = 256
	maxThresholds    = 16
)

// sample is at most n of rs, evenly spread.
func sample(rs []Request, n int) []Request {
	if len(rs) <= n {
		return rs
	}
	out := make([]Request, n)
	step := float64(len(rs)) / float64(n)
	for i := range out {
		out[i] = rs[int(float64(i)*step)]
	}
	return out
}
