package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/decider/conditional"
	"github.com/tandem-serve/tandem/internal/router/decider/priced"
)

// PlanPath is the route that answers the planner's last decision and the
// numbers behind it (GET; `tandem plan` reads it). It changes nothing: no
// request a client sends moves an engine between the pools.
const PlanPath = "/tandem/plan"

// Defaults of the planner's loop (Config).
const (
	defaultPlanInterval = 5 * time.Second
	defaultDrainTimeout = 2 * time.Minute
)

// planState is the proxy's side of the planner: the pure planner behind
// a lock, its last decision, and the engine mover.
type planState struct {
	mu   sync.Mutex
	pl   *planner.Planner
	last *planner.Decision
	// prev is each engine's previous scrape (URL → sample), for its ITL
	// and batch over the scrape interval; roles each engine's role as its
	// tandem:engine_info says ("" when it says none).
	prev  map[string]engineSample
	roles map[string]string
	// pinned is each engine the mover may not move and why, as of the
	// last decision.
	pinned map[string]string

	// target is the prefill count the mover works toward; kick wakes it.
	target atomic.Int64
	kick   chan struct{}
	// moving names the engine being moved ("URL prefill→decode"), "" when
	// none: set while it changes pools, not while its old work finishes.
	moving atomic.Pointer[string]
	// finishing is each engine that joined its new pool while its work of
	// the old role goes on (URL → "prefill→decode"), under mu: the mover
	// leaves it where it is until that work has ended (planner_move.go).
	finishing map[string]string
	// bg counts the watchers of that old work.
	bg sync.WaitGroup
	// minPrefill and minDecode bound the pools the mover leaves (the
	// planner's bounds): minPrefill is 0 when the decider keeps every
	// prompt local with no prefill engine, so the split may be colocated.
	minPrefill, minDecode int

	desired   *prometheus.GaugeVec // role
	threshold prometheus.Gauge
	cadence   prometheus.Gauge
	goodput   prometheus.Gauge
	decisions *prometheus.CounterVec // result: changed, held, steady
	switches  *prometheus.CounterVec // to: prefill, decode
	drainOver prometheus.Counter

	// decided is the decider's decisions over the planner's window, under
	// mu (planner_decider.go).
	decided decisionWindow

	cad     cadenceState // the prefill cadence set on the engines (planner_cadence.go)
	changed bool         // a decision has changed the split
}

// initPlanner sets up Config.Planner: it needs static backends when it
// acts (nothing else may change the pools under the mover; the admin
// route refuses changes then).
func (p *Proxy) initPlanner() error {
	cfg := *p.cfg.Planner
	if p.cfg.PlannerAct && (p.cfg.BackendsFile != "" || p.cfg.DynamicBackends) {
		return errors.New("the planner moves engines between the pools itself: it cannot act on backends a file or discovery keeps (publish only, or list the engines)")
	}
	if cfg.Engines == 0 {
		// Discovery may not have delivered the pools yet: each decision
		// counts them (SetEngines); until then the smallest split.
		cfg.Engines = max(len(p.cfg.Prefill)+len(p.cfg.Decode), max(cfg.MinPrefill, 1)+max(cfg.MinDecode, 1))
	}
	if cfg.Prefill == 0 {
		cfg.Prefill = len(p.cfg.Prefill)
	}
	if cfg.Threshold == 0 {
		cfg.Threshold = cmpOr(p.cfg.Router.Threshold, 256)
	}
	// Acting, the mover says when the engines of a change have switched
	// pools (planApplied): the planner measures the new split from then.
	cfg.ReportsApplied = p.cfg.PlannerAct
	if !keepsLocalWithoutPrefill(p.cfg.PDDecider) {
		// The decider sends prompts to a prefill engine whatever the
		// load: the split keeps one.
		cfg.MinPrefill = max(cfg.MinPrefill, 1)
	}
	pl, err := planner.New(cfg)
	if err != nil {
		return err
	}
	s := &planState{pl: pl, prev: map[string]engineSample{}, roles: map[string]string{}, finishing: map[string]string{}, kick: make(chan struct{}, 1),
		minPrefill: pl.Config().MinPrefill, minDecode: pl.Config().MinDecode, decided: decisionWindow{window: pl.Config().Window}}
	s.target.Store(int64(pl.Config().Prefill))
	p.steerDecider(pl.Config())
	s.desired = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tandem:planner_desired_replicas",
		Help: "Engines the planner wants in each pool (role: prefill, decode)."}, []string{"role"})
	thHelp := "The conditional decider's threshold the planner chose (uncached prompt tokens from which a prefill is remote)."
	switch thresholdRole(p.cfg.PDDecider) {
	case "fallback":
		thHelp = "The threshold the planner values its split at (uncached prompt tokens from which a prefill is remote): informational under the priced decider, which decides each request by its price and uses the threshold only for requests it cannot price yet (reason unpriced_*) or serve within the objectives either way (planned_*)."
	case "unused":
		thHelp = "The threshold the planner values its split at (uncached prompt tokens from which a prefill is remote): informational, the " + p.cfg.PDDecider + " decider does not use it."
	}
	s.threshold = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tandem:planner_threshold_tokens", Help: thHelp})
	s.cadence = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tandem:planner_prefill_schedule_interval",
		Help: "The prefill cadence the planner advises for engines that prefill beside their decodes (tandem serve --prefill-schedule-interval)."})
	s.goodput = prometheus.NewGauge(prometheus.GaugeOpts{Name: "tandem:planner_predicted_goodput_rps",
		Help: "Requests/s the planner's model predicts the desired split serves within the SLOs."})
	s.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem:planner_decisions_total",
		Help: "Planner decisions by result: changed (the split moved), held (it did not move toward the best; see /tandem/plan), steady."}, []string{"result"})
	s.switches = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem:planner_role_switches_total",
		Help: "Engines the planner moved between the pools, by the role they took."}, []string{"to"})
	s.drainOver = prometheus.NewCounter(prometheus.CounterOpts{Name: "tandem:planner_drain_timeouts_total",
		Help: "Engines the planner may move again before their old role's work was seen to end, after Config.DrainTimeout."})
	p.metrics.registry.MustRegister(s.desired, s.threshold, s.cadence, s.goodput, s.decisions, s.switches, s.drainOver)
	s.desired.WithLabelValues(rolePrefill).Set(float64(pl.Config().Prefill))
	s.desired.WithLabelValues(roleDecode).Set(float64(pl.Config().Engines - pl.Config().Prefill))
	s.threshold.Set(float64(pl.Config().Threshold))
	s.cadence.Set(1)
	s.initCadence(p.metrics.registry)
	p.plan = s
	return nil
}

// keepsLocalWithoutPrefill says the decider named prefills every prompt
// on its decode when the prefill pool is empty (no prefill engine free):
// the conditional and priced deciders do, always does not.
func keepsLocalWithoutPrefill(decider string) bool {
	return decider == conditional.Name || decider == priced.Name
}

// colocated says the prefill pool may be empty by design (the proxy was
// started with none, or the planner may have emptied it): every request is
// then served on a decode, and the proxy is ready without a prefill engine.
func (p *Proxy) colocated() bool {
	return p.startedColocated || (p.plan != nil && p.plan.minPrefill == 0)
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// observePlan tells the planner of a routed request whose decode is d,
// and counts the decider's decision in its window.
func (p *Proxy) observePlan(preq *router.Request, d *backend, arrived time.Time, decision router.Decision) {
	if p.plan == nil {
		return
	}
	uncached := preq.PromptTokens
	if p.decode.prefix != nil && len(preq.BlockHashes) > 0 {
		uncached = max(uncached-p.matchPrefix(preq)[d.base]*preq.BlockSize, 0)
	}
	p.plan.mu.Lock()
	p.plan.pl.ObserveRequest(planner.Request{At: arrived, ID: preq.ID, PromptTokens: preq.PromptTokens, UncachedTokens: uncached, OutputTokens: preq.MaxTokens})
	p.plan.decided.add(arrived, decision)
	p.plan.mu.Unlock()
}

// observePlanPrefill tells the planner of a prefill measured on the engine
// at url (observePrefillLeg): tokens computed in prefill seconds, local
// when a decode prefilled its own prompt. The planner prices prefills by
// the curve it fits to these.
func (p *Proxy) observePlanPrefill(url string, tokens int, prefill time.Duration, local bool) {
	if p.plan == nil {
		return
	}
	s := planner.PrefillSample{At: p.now(), URL: url, Tokens: tokens, Seconds: prefill.Seconds(), Local: local}
	p.plan.mu.Lock()
	p.plan.pl.ObservePrefill(s)
	p.plan.mu.Unlock()
}

// observeScrape tells the planner of an engine's scrape s: its prefill and
// transfer costs and, for a decode, its mean inter-token latency and batch
// since its previous scrape.
func (p *Proxy) observeScrape(b *backend, s engineSample, c costs) {
	if p.plan == nil {
		return
	}
	es := planner.EngineSample{At: s.at, URL: b.base, Decode: b.role == roleDecode,
		PrefillSecondsPerToken: c.prefillPerToken, TransferSecondsPerToken: c.transferPerToken,
		Idle: s.running == 0 && s.waiting == 0, MaxBatchedTokens: s.info.maxBatched}
	p.plan.mu.Lock()
	defer p.plan.mu.Unlock()
	p.plan.roles[b.base] = s.info.role
	if prev, ok := p.plan.prev[b.base]; ok {
		es.ITLSeconds, es.Running = decodeStep(prev, s, c.prefillPerToken)
	}
	p.plan.prev[b.base] = s
	p.plan.pl.ObserveEngine(es)
}

// decodeStep is an engine's mean decode step (s) and batch between two
// scrapes, 0 when it decoded nothing. The prompts it computed meanwhile
// (at prefillPerToken s/token) stretched its inter-token latencies by
// 1/(1−ρ), ρ their share of the interval: the step's own cost is the rest,
// so that the planner's model, which adds the stalls back for the prompts
// it keeps local, does not count them twice.
func decodeStep(prev, s engineSample, prefillPerToken float64) (itl, running float64) {
	if s.itlCount <= prev.itlCount || s.itlSum < prev.itlSum {
		return 0, 0
	}
	itl = (s.itlSum - prev.itlSum) / (s.itlCount - prev.itlCount)
	if dt := s.at.Sub(prev.at).Seconds(); dt > 0 && prefillPerToken > 0 && s.computed > prev.computed {
		itl *= 1 - min((s.computed-prev.computed)*prefillPerToken/dt, 0.9)
	}
	return itl, (s.running + prev.running) / 2
}

// runPlanner decides every Config.PlanInterval until ctx is done, and
// with Config.PlannerAct moves engines between the pools.
func (p *Proxy) runPlanner(ctx context.Context) {
	var wg sync.WaitGroup
	if p.cfg.PlannerAct {
		wg.Go(func() { p.moveEngines(ctx) })
	}
	defer p.plan.bg.Wait()
	defer wg.Wait()
	t := time.NewTicker(p.cfg.PlanInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.planOnce(p.now())
	}
}

// planOnce makes one decision at now and publishes it.
func (p *Proxy) planOnce(now time.Time) planner.Decision {
	s := p.plan
	n := len(p.prefill.list()) + len(p.decode.list())
	if s.moving.Load() != nil {
		n++ // the engine between the pools
	}
	var pinnedP, pinnedD int
	pinned := map[string]string{}
	if p.cfg.PlannerAct {
		pinned, pinnedP, pinnedD = p.pinned()
	}
	s.mu.Lock()
	switch {
	case !p.cfg.PlannerAct && !s.changed:
		// Publishing, until its first change its split is the pools' (as
		// discovery delivered them), not its start guess: a held decision
		// must not scale the Deployments to that guess.
		s.pl.SetSplit(len(p.prefill.list()), n)
	case !p.cfg.PlannerAct || s.moving.Load() == nil:
		s.pl.SetEngines(n)
		s.pl.SetPinned(pinnedP, pinnedD)
		if p.cfg.PlannerAct {
			// The pools may be the split already (the bounds moved it).
			s.pl.Applied(now, len(p.prefill.list()))
		}
	}
	s.pinned = pinned
	d := s.pl.Decide(now)
	s.changed = s.changed || d.Changed
	held := s.last == nil || s.last.Held != d.Held
	s.last = &d
	s.mu.Unlock()

	s.desired.WithLabelValues(rolePrefill).Set(float64(d.Prefill))
	s.desired.WithLabelValues(roleDecode).Set(float64(d.Decode))
	s.threshold.Set(float64(d.Threshold))
	s.cadence.Set(float64(d.PrefillScheduleInterval))
	s.goodput.Set(d.Fit.Current.Goodput)
	if sd, ok := p.decider.(steeredDecider); ok {
		sd.setThreshold(d.Threshold)
	}
	switch {
	case d.Changed:
		s.decisions.WithLabelValues("changed").Inc()
		p.log.Info("planner: split changed", "prefill", d.Prefill, "decode", d.Decode, "best_prefill", d.Best.P,
			"predicted_goodput_rps", d.Best.Goodput, "threshold", d.Threshold, "prefill_schedule_interval", d.PrefillScheduleInterval)
	case d.Held != "":
		s.decisions.WithLabelValues("held").Inc()
		if held {
			p.log.Info("planner: split held", "prefill", d.Prefill, "decode", d.Decode, "why", d.Held)
		}
	default:
		s.decisions.WithLabelValues("steady").Inc()
	}
	if p.cfg.PlannerAct {
		p.applyCadence(d)
		s.target.Store(int64(d.Prefill))
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	if p.cfg.OnPlan != nil {
		p.cfg.OnPlan(d)
	}
	return d
}

// planBody is the JSON answer of PlanPath.
type planBody struct {
	// Decision is the last decision; nil before the first.
	Decision *planner.Decision `json:"decision"`
	// Acting says the proxy moves engines between the pools; otherwise it
	// only publishes the decision (metrics, Kubernetes scaling).
	Acting bool   `json:"acting"`
	Moving string `json:"moving,omitempty"`
	// Finishing are the engines that joined their new pool while their
	// old role's work (legs in flight, KV held for decodes) goes on, and
	// the move ("prefill→decode"): the planner moves them again only
	// once it has ended.
	Finishing map[string]string `json:"finishing,omitempty"`
	Prefill   []string          `json:"prefill"`
	Decode    []string          `json:"decode"`
	// Cadence is the prefill cadence set on the decode pool, when acting.
	Cadence *cadenceReport `json:"cadence,omitempty"`
	// Pinned are the engines the planner may not move, and why.
	Pinned map[string]string `json:"pinned,omitempty"`
	// Objectives are the SLOs and the planner's guards.
	Objectives planObjectives `json:"objectives"`
	// Decider is what the disaggregation decider did with the window's
	// requests, and what the decision's threshold is to it.
	Decider deciderReport `json:"decider"`
}

type planObjectives struct {
	TTFT       string  `json:"ttft"`
	TPOT       string  `json:"tpot"`
	Goal       float64 `json:"goal"`
	Window     string  `json:"window"`
	MaxAge     string  `json:"max_age"`
	MinDwell   string  `json:"min_dwell"`
	Hysteresis float64 `json:"hysteresis"`
}

func (p *Proxy) handlePlan(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		writeError(w, http.StatusMethodNotAllowed, "use GET "+PlanPath)
		return
	}
	if p.plan == nil {
		writeError(w, http.StatusNotFound, "the planner is off: start the proxy with --slo-ttft and --slo-tpot")
		return
	}
	p.plan.mu.Lock()
	cfg := p.plan.pl.Config()
	body := planBody{Decision: p.plan.last, Acting: p.cfg.PlannerAct, Prefill: urlsOf(p.prefill), Decode: urlsOf(p.decode), Pinned: p.plan.pinned,
		Finishing: maps.Clone(p.plan.finishing), Decider: p.plan.decided.report(p.cfg.PDDecider, p.now()),
		Objectives: planObjectives{TTFT: cfg.TTFT.String(), TPOT: cfg.TPOT.String(), Goal: cfg.Goal, Window: cfg.Window.String(),
			MaxAge: cfg.MaxAge.String(), MinDwell: cfg.MinDwell.String(), Hysteresis: cfg.Hysteresis}}
	p.plan.mu.Unlock()
	if m := p.plan.moving.Load(); m != nil {
		body.Moving = *m
	}
	body.Cadence = p.cadenceReport()
	b, _ := json.MarshalIndent(body, "", "  ")
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}
