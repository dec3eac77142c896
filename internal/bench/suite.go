package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tandem-serve/tandem/internal/bench/workload"
	"github.com/tandem-serve/tandem/internal/progress"
)

// Target is one server under test.
type Target struct {
	// Name labels the target in tables and plots, e.g. "pd".
	Name string `json:"name"`
	// URL is its root, e.g. "http://127.0.0.1:8000".
	URL string `json:"url"`
}

// ParseTarget parses NAME=URL (or a bare URL, named after its host:port).
func ParseTarget(s string) (Target, error) {
	name, url, ok := strings.Cut(s, "=")
	if !ok {
		url = s
		name = strings.TrimPrefix(strings.TrimPrefix(s, "http://"), "https://")
	}
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") || name == "" {
		return Target{}, fmt.Errorf("target %q: want NAME=http://HOST:PORT", s)
	}
	return Target{Name: name, URL: strings.TrimRight(url, "/")}, nil
}

// Plan is a benchmark of one workload against one or more targets at one or
// more loads.
type Plan struct {
	Targets []Target `json:"targets"`
	// Model is the model name sent in every request (required: the run
	// never needs /v1/models).
	Model    string             `json:"model"`
	Workload *workload.Workload `json:"workload"`
	// Loads are run one after another. A trace workload (TimedArrivals)
	// ignores their Rate and uses its own times.
	Loads []Load `json:"loads"`
	// Rounds is how many times the workload runs against every target at
	// every load. Rounds alternate the order of the targets (A B, then
	// B A), so drift in this machine's speed falls on both. Default 1.
	Rounds int `json:"rounds"`
	// Seed fixes the arrival times.
	Seed uint64 `json:"seed"`
	// Goal is the fraction of requests that must meet the SLO for a rate
	// to count as sustained in the Capacity summary (DistServe's 90%).
	// Default 0.9.
	Goal float64 `json:"goal,omitempty"`
	// Timeout bounds each request.
	Timeout time.Duration `json:"timeout_ns"`
	// SLO decides which requests count towards goodput.
	SLO SLO `json:"slo"`
	// Tokenize, when set, turns an answer's text back into token ids for
	// the next turn of a conversation; without it the next turn appends
	// the answer's length in stand-in tokens.
	Tokenize func(ctx context.Context, target Target, text string) ([]int32, error) `json:"-"`
	// Pool is where stand-in tokens come from, and with the workload's
	// own ids the alphabet each level's prompts are relabelled in.
	Pool []int32 `json:"-"`
	// APIKey is sent as Authorization: Bearer.
	APIKey string `json:"-"`
	// FirstLevel numbers the first level of this run, so that runs of
	// one workload that must not share prompts (a tuning run before the
	// measured ones against a server that may keep its cache, the rates of
	// a search) take disjoint level numbers; see Run.
	FirstLevel int `json:"first_level,omitempty"`
	// Warmup, when set, records the requests sent to every target before
	// the measured ones (not by Run: by the driver that sets it), so that
	// a saved run says what it was.
	Warmup *Warmup `json:"warmup,omitempty"`
	// Progress, when set, shows each level's requests done, failed and
	// in flight as it runs, and gets the run's warnings.
	Progress *progress.Display `json:"-"`
}

// Record is the measurement of one request (one turn).
type Record struct {
	Conversation int `json:"conv"`
	Turn         int `json:"turn,omitempty"`
	Round        int `json:"round,omitempty"`
	// Start is when the request was sent, from the start of its level.
	Start        time.Duration   `json:"start_ns"`
	TTFT         time.Duration   `json:"ttft_ns"`
	E2E          time.Duration   `json:"e2e_ns"`
	ITL          []time.Duration `json:"itl_ns,omitempty"`
	PromptTokens int             `json:"prompt_tokens"`
	OutputTokens int             `json:"output_tokens"`
	// PD is the x-tandem-pd header: "remote", "fallback; reason=...", or
	// "" when the server does not send it.
	PD string `json:"pd,omitempty"`
	// Timing is the answer's Server-Timing durations in milliseconds by
	// name: the engines' api, queue, kv_pull and prefill, the P/D proxy's
	// prefill_leg and proxy (see Breakdown).
	Timing map[string]float64 `json:"server_timing_ms,omitempty"`
	// Err is the failure, "" for a complete answer.
	Err string `json:"error,omitempty"`
}

func (r *Record) tpot() time.Duration {
	if r.OutputTokens < 2 {
		return 0
	}
	return (r.E2E - r.TTFT) / time.Duration(r.OutputTokens-1)
}

// Result is one target at one load, all rounds together.
type Result struct {
	Target string `json:"target"`
	Load   Load   `json:"load"`
	*Report
	// Attained is the fraction of requests (failures count as misses) that
	// met the plan's SLO, Goodput those requests per second.
	Attained float64 `json:"slo_attainment"`
	Goodput  float64 `json:"goodput_rps"`
	// Curve is the attainment at each of SLOScales times the SLO.
	Curve []CurvePoint `json:"slo_curve,omitempty"`
	// Paths counts requests by their x-tandem-pd value (its text before
	// any ';' detail: "remote", "fallback"; "none" without the header).
	Paths map[string]int `json:"pd_paths"`
	// Breakdown splits the requests' TTFT by their Server-Timing headers;
	// nil when no answer had one.
	Breakdown *Breakdown `json:"ttft_breakdown,omitempty"`
	Records   []Record   `json:"records"`
}

// Suite is the whole run: what was asked and every result.
type Suite struct {
	Plan    *Plan     `json:"plan"`
	Started time.Time `json:"started"`
	// Prompts describes the prompts of every level (the plan's workload
	// keeps its conversations out of the JSON).
	Prompts *PromptSet `json:"prompts,omitempty"`
	Results []*Result  `json:"results"`
	// Capacity is each target's goodput rate and peak throughput over the
	// run's rates (Capacities), when the plan has an SLO.
	Capacity []Capacity `json:"capacity,omitempty"`
	// Grid is every target's goodput rate under each pair of scaled TTFT
	// and TPOT objectives (SLOGrid at GridScales), when the plan has both.
	Grid []GridCell `json:"slo_grid,omitempty"`
	// Search is the rate search's outcome per target, when the run was one
	// (SearchSuite).
	Search []SearchResult `json:"search,omitempty"`
}

func (p *Plan) check() error {
	switch {
	case len(p.Targets) == 0:
		return errors.New("no target: give --url or --target NAME=URL")
	case p.Model == "":
		return errors.New("no model name")
	case p.Workload == nil || p.Workload.Requests() == 0:
		return errors.New("the workload has no requests")
	case len(p.Loads) == 0:
		return errors.New("no load: give --rate, --concurrency or a sweep")
	case p.Timeout <= 0:
		return errors.New("the request timeout must be positive")
	case p.Goal < 0 || p.Goal > 1:
		return fmt.Errorf("goal %v: want a fraction in (0, 1]", p.Goal)
	}
	names := map[string]bool{}
	for _, t := range p.Targets {
		if names[t.Name] {
			return fmt.Errorf("two targets are named %q", t.Name)
		}
		names[t.Name] = true
	}
	for _, l := range p.Loads {
		if l.Rate < 0 || l.Concurrency < 0 || l.Burstiness < 0 || (l.Rate == 0 && l.Concurrency == 0 && !p.Workload.TimedArrivals) {
			return fmt.Errorf("load %+v: want a positive rate or concurrency", l)
		}
	}
	return nil
}

// Run runs the plan: for each load, Rounds rounds, each sending the whole
// workload to every target in turn. It returns the results so far when ctx
// is cancelled, with ctx's error.
//
// Every (load, round) is a level with prompts of its own: the workload
// relabelled (workload.Relabel) by the level's number, so that a server's
// prefix cache cannot serve one level's prompts from an earlier level's
// (sending the same prompts at every rate would make every level after the
// first mostly cache hits). The sharing the workload itself means — shared
// prefixes, conversation histories — is kept within the level. The targets
// of one round get the same prompts: they are separate servers, so one
// cannot warm another's cache.
func Run(ctx context.Context, p *Plan) (*Suite, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	rounds := max(p.Rounds, 1)
	s := &Suite{Plan: p, Started: time.Now(), Prompts: DescribePrompts(p.Workload)}
	clients := make([]*Client, len(p.Targets))
	for i, t := range p.Targets {
		clients[i] = NewClient(t.URL, min(p.Workload.Requests(), 256))
		clients[i].APIKey = p.APIKey
	}
	alphabet := p.Workload.Alphabet(p.Pool)
	if n := p.FirstLevel + p.Levels(); n > len(alphabet) && p.Progress != nil {
		fmt.Fprintf(p.Progress.Writer(), "warning: %d levels but only %d distinct token ids: levels %d apart send the same prompts, and a prefix cache serves the later from the earlier\n",
			n, len(alphabet), len(alphabet))
	}
	for li, load := range p.Loads {
		results := make([]*Result, len(p.Targets))
		durs := make([]time.Duration, len(p.Targets))
		for i, t := range p.Targets {
			results[i] = &Result{Target: t.Name, Load: load}
		}
		for round := range rounds {
			w := p.Workload.Relabel(alphabet, p.FirstLevel+li*rounds+round)
			for k := range p.Targets {
				i := k
				if round%2 == 1 {
					i = len(p.Targets) - 1 - k
				}
				if ctx.Err() != nil {
					return s, ctx.Err()
				}
				recs, d := p.runLevel(ctx, clients[i], p.Targets[i], w, load, round, rounds)
				results[i].Records = append(results[i].Records, recs...)
				durs[i] += d
			}
		}
		for i := range results {
			results[i].summarize(p, durs[i])
			s.Results = append(s.Results, results[i])
		}
	}
	if p.SLO.Set() {
		s.Capacity = Capacities(s)
		s.Grid = SLOGrid(s, GridScales, GridScales)
	}
	return s, ctx.Err()
}

// Levels is the number of distinct prompt sets a run of p sends (loads
// times rounds). Relabelling keeps them apart while it is at most the size
// of the alphabet (the pool and the workload's ids).
func (p *Plan) Levels() int { return len(p.Loads) * max(p.Rounds, 1) }

// summarize fills the report fields from the records.
func (r *Result) summarize(p *Plan, d time.Duration) {
	outcomes := make([]Outcome, len(r.Records))
	r.Paths = map[string]int{}
	for i, rec := range r.Records {
		o := Outcome{TTFT: rec.TTFT, E2E: rec.E2E, ITL: rec.ITL, PromptTokens: rec.PromptTokens, OutputTokens: rec.OutputTokens}
		if rec.Err != "" {
			o.Err = errors.New(rec.Err)
		}
		outcomes[i] = o
		path, _, _ := strings.Cut(rec.PD, ";")
		r.Paths[cmp.Or(strings.TrimSpace(path), "none")]++
	}
	r.Report = NewReport(p.Model, r.Load, d, outcomes)
	r.Breakdown = NewBreakdown(r.Records)
	r.score(p.SLO)
}

// score sets the SLO fields of r (attainment, goodput, the curve over
// SLOScales) under slo, from its records; with no objective it clears
// them.
func (r *Result) score(slo SLO) {
	r.Attained, r.Goodput, r.Curve = 0, 0, nil
	if !slo.Set() {
		return
	}
	var met int
	r.Attained, met = Attainment(slo, r.Records)
	if r.Report != nil && r.Duration > 0 {
		r.Goodput = float64(met) / r.Duration
	}
	for _, f := range SLOScales {
		a, _ := Attainment(slo.Scale(f), r.Records)
		r.Curve = append(r.Curve, CurvePoint{Scale: f, Attainment: a})
	}
}

// Rescore recomputes everything s derives from its SLO and goal — every
// result's attainment, goodput and SLO curve, the capacities and the SLO
// grid — from the recorded requests, under slo and goal (0: the plan's
// goal). It is how a saved run is re-read under other objectives (tandem
// bench report). A rate search's suite keeps its search points.
func (s *Suite) Rescore(slo SLO, goal float64) {
	if s.Plan == nil {
		s.Plan = &Plan{}
	}
	s.Plan.SLO = slo
	if goal > 0 {
		s.Plan.Goal = goal
	}
	for _, r := range s.Results {
		r.score(slo)
	}
	if len(s.Search) > 0 {
		return // its capacities are the search's answers, not a rate sweep's
	}
	s.Capacity, s.Grid = nil, nil
	if slo.Set() {
		s.Capacity = Capacities(s)
		s.Grid = SLOGrid(s, GridScales, GridScales)
	}
}

// ReadSuite reads a run written as JSON by tandem bench --json or tandem
// bench experiment (results-*.json).
func ReadSuite(r io.Reader) (*Suite, error) {
	var s Suite
	dec := json.NewDecoder(r)
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("reading a benchmark run: %w", err)
	}
	if s.Plan == nil || s.Plan.Workload == nil {
		return nil, errors.New("reading a benchmark run: no plan or workload in it (not a tandem bench --json file?)")
	}
	return &s, nil
}

// runLevel sends the whole workload to one target at one load and returns
// the records and the time from the first send to the last answer.
func (p *Plan) runLevel(ctx context.Context, c *Client, t Target, w *workload.Workload, load Load, round, rounds int) ([]Record, time.Duration) {
	n := len(w.Conversations)
	var arrivals []time.Duration
	if w.TimedArrivals {
		arrivals = make([]time.Duration, n)
		for i := range w.Conversations {
			arrivals[i] = w.Conversations[i].Arrival
		}
	} else {
		arrivals = load.schedule(p.Seed, n)
	}
	recs := make([][]Record, n)
	start := time.Now()
	lp := newLevelProgress(p.Progress, fmt.Sprintf("%s %s round %d/%d", t.Name, load, round+1, rounds), w.Requests())

	conv := func(i int) {
		recs[i] = p.runConversation(ctx, c, t, &w.Conversations[i], i, start, round, lp)
	}
	var wg sync.WaitGroup
	if arrivals == nil { // closed loop
		next := atomic.Int64{}
		for range min(load.Concurrency, n) {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= n || ctx.Err() != nil {
						return
					}
					conv(i)
				}
			})
		}
	} else {
		var sem chan struct{}
		if load.Concurrency > 0 {
			sem = make(chan struct{}, load.Concurrency)
		}
		for i := range n {
			if !sleepUntil(ctx, start.Add(arrivals[i])) {
				break
			}
			if sem != nil {
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
				}
			}
			wg.Go(func() {
				if sem != nil {
					defer func() { <-sem }()
				}
				conv(i)
			})
		}
	}
	wg.Wait()
	d := time.Since(start)
	lp.stage.Done()
	var out []Record
	for _, r := range recs {
		out = append(out, r...)
	}
	return out, d
}

// runConversation sends one conversation's turns in order, each after its
// think time, each prompt the history so far plus the turn's new tokens.
func (p *Plan) runConversation(ctx context.Context, c *Client, t Target, cv *workload.Conversation, i int, levelStart time.Time, round int, lp levelProgress) []Record {
	var hist []int32
	var out []Record
	for j, turn := range cv.Turns {
		if j > 0 && !sleepUntil(ctx, time.Now().Add(turn.Think)) {
			break
		}
		prompt := append(slices.Clip(hist), turn.Prompt...)
		rctx, cancel := context.WithTimeout(ctx, p.Timeout)
		sent := time.Now()
		lp.inflight.Add(1)
		o := c.Stream(rctx, CompletionRequest{
			Model: p.Model, Prompt: prompt, MaxTokens: turn.MaxTokens, IgnoreEOS: true, ConversationID: cv.ID,
		})
		lp.inflight.Add(-1)
		cancel()
		rec := Record{
			Conversation: i, Turn: j, Round: round, Start: sent.Sub(levelStart),
			TTFT: o.TTFT, E2E: o.E2E, ITL: o.ITL, PromptTokens: cmp.Or(o.PromptTokens, len(prompt)),
			OutputTokens: o.OutputTokens, PD: o.PD, Timing: o.Timing,
		}
		lp.stage.Add(1)
		if o.Err != nil {
			rec.Err = o.Err.Error()
			lp.failed.Add(1)
			out = append(out, rec)
			break // a conversation does not go on past a failed turn
		}
		out = append(out, rec)
		if j+1 < len(cv.Turns) {
			hist = append(prompt, p.answerTokens(ctx, t, o, i, j)...)
		}
	}
	return out
}

// answerTokens is what the next turn appends for an answer: its text as the
// server tokenizes it, or (without a tokenizer) as many stand-in tokens as
// the answer had.
func (p *Plan) answerTokens(ctx context.Context, t Target, o Outcome, conv, turn int) []int32 {
	if p.Tokenize != nil && o.Text != "" {
		if ids, err := p.Tokenize(ctx, t, o.Text); err == nil && len(ids) > 0 {
			return ids
		}
	}
	pool := p.Pool
	if len(pool) == 0 {
		pool = []int32{100}
	}
	r := rand.New(rand.NewPCG(p.Seed^uint64(conv), uint64(turn)))
	ids := make([]int32, o.OutputTokens)
	for k := range ids {
		ids[k] = pool[r.IntN(len(pool))]
	}
	return ids
}

// levelProgress is a level's stage on the Display: requests done, failed
// and in flight (all nil, doing nothing, without a Display).
type levelProgress struct {
	stage            *progress.Stage
	failed, inflight *progress.Counter
}

func newLevelProgress(d *progress.Display, name string, requests int) levelProgress {
	s := d.Start(name, int64(requests), progress.Items("requests"))
	return levelProgress{stage: s, failed: s.Warning("failed"), inflight: s.Gauge("in flight")}
}
