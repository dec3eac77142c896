package bench

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"reflect"
	"slices"

	"github.com/tandem-serve/tandem/internal/bench/workload"
)

// PromptSet describes the prompts a run sent at each level (its workload
// before relabelling), saved with the run because the workload's
// conversations are not: runs saved apart are the same workload when
// their PromptSets are equal (tandem bench report --merge checks it).
type PromptSet struct {
	// Requests is the requests (turns) of one level and round.
	Requests   int     `json:"requests"`
	MeanPrompt float64 `json:"mean_prompt_tokens"`
	MeanOutput float64 `json:"mean_output_tokens"`
	// Digest is a SHA-256 of every turn's prompt ids, output length,
	// think time and arrival time, in order.
	Digest string `json:"digest"`
}

// DescribePrompts is w's PromptSet; nil for a nil or empty workload.
func DescribePrompts(w *workload.Workload) *PromptSet {
	if w == nil || w.Requests() == 0 {
		return nil
	}
	p := &PromptSet{Requests: w.Requests()}
	p.MeanPrompt, p.MeanOutput = w.Stats()
	h := sha256.New()
	word := func(v int64) { _ = binary.Write(h, binary.LittleEndian, v) }
	word(int64(len(w.Conversations)))
	for _, c := range w.Conversations {
		word(int64(c.Arrival))
		word(int64(len(c.Turns)))
		for _, t := range c.Turns {
			word(int64(t.MaxTokens))
			word(int64(t.Think))
			word(int64(len(t.Prompt)))
			_ = binary.Write(h, binary.LittleEndian, t.Prompt)
		}
	}
	p.Digest = hex.EncodeToString(h.Sum(nil))
	return p
}

// Warmup records the requests every target was sent before a run's
// measured ones, not counted (tandem bench experiment's --warmup). Run
// does not send them: the driver that did records them in the plan for
// the reports.
type Warmup struct {
	Requests int     `json:"requests"`
	Rate     float64 `json:"rate"`
}

// String is "none" or "N requests at R req/s".
func (w *Warmup) String() string {
	if w.Requests == 0 {
		return "none"
	}
	return fmt.Sprintf("%d requests at %g req/s", w.Requests, w.Rate)
}

// RequestsPerLevel is the requests of one level and round of s: from its
// Prompts, else (a run saved before they were) the most any result of s
// recorded, divided by the rounds.
func RequestsPerLevel(s *Suite) int {
	if s.Prompts != nil {
		return s.Prompts.Requests
	}
	n := 0
	for _, r := range s.Results {
		n = max(n, len(r.Records))
	}
	return n / max(s.Plan.Rounds, 1)
}

// Differences lists what keeps runs a and b (saved apart, say the static
// configurations and then the adaptive one) from being reported as one
// run: their workload and its prompts, model, requests per level, arrival
// rates, rounds, seed, warm-up, goal and request timeout, each as "what:
// a's against b's". Empty when they are comparable. The SLO is not
// compared (a run scored under scaled objectives is comparable to one
// under the workload's own; the caller checks it), nor is FirstLevel (see
// LevelNote).
func Differences(a, b *Suite) []string {
	pa, pb := a.Plan, b.Plan
	var out []string
	diff := func(what string, x, y any) {
		if !reflect.DeepEqual(x, y) {
			out = append(out, fmt.Sprintf("%s: %v against %v", what, x, y))
		}
	}
	diff("workload", pa.Workload.Name, pb.Workload.Name)
	diff("model", pa.Model, pb.Model)
	diff("seed", pa.Seed, pb.Seed)
	diff("requests per rate and round", RequestsPerLevel(a), RequestsPerLevel(b))
	if a.Prompts != nil && b.Prompts != nil && a.Prompts.Digest != b.Prompts.Digest {
		out = append(out, fmt.Sprintf("prompts: digest %.12s against %.12s (another tokenizer, --max-context or workload version)", a.Prompts.Digest, b.Prompts.Digest))
	}
	diff("loads", loadTexts(pa.Loads), loadTexts(pb.Loads))
	diff("rounds", max(pa.Rounds, 1), max(pb.Rounds, 1))
	if pa.Warmup != nil && pb.Warmup != nil {
		diff("warm-up", pa.Warmup.String(), pb.Warmup.String())
	}
	diff("goal", goalOf(pa), goalOf(pb))
	diff("request timeout", pa.Timeout, pb.Timeout)
	return out
}

// LevelNote says, when a and b numbered their prompt levels from
// different first levels (one run made tuning runs before its measured
// ones, say), that their prompts are the same up to a renaming of token
// ids (Workload.Relabel shifts the alphabet by the level): the same
// lengths and the same sharing within a level. "" when they did not.
func LevelNote(a, b *Suite) string {
	if a.Plan.FirstLevel == b.Plan.FirstLevel {
		return ""
	}
	return fmt.Sprintf("prompt levels numbered from %d against %d: the same prompts up to a renaming of token ids (lengths and prefix sharing equal)",
		a.Plan.FirstLevel, b.Plan.FirstLevel)
}

func goalOf(p *Plan) float64 {
	if p.Goal > 0 {
		return p.Goal
	}
	return DefaultGoal
}

func loadTexts(ls []Load) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.String()
	}
	return out
}

// MergeSuites is one suite of the results of every suite in suites,
// which the caller has found comparable (Differences): the first suite's
// plan with every suite's targets and results, in order, and the earliest
// start. A
// target in two suites with the same results (the same run read twice) is
// kept once; with different results it is an error. The merged suite is
// not scored: call Rescore.
func MergeSuites(suites []*Suite) (*Suite, error) {
	if len(suites) == 0 {
		return nil, fmt.Errorf("no run to merge")
	}
	p := *suites[0].Plan
	p.Targets = nil
	s := &Suite{Plan: &p, Prompts: suites[0].Prompts}
	for _, in := range suites {
		if s.Started.IsZero() || (!in.Started.IsZero() && in.Started.Before(s.Started)) {
			s.Started = in.Started
		}
		if s.Prompts == nil {
			s.Prompts = in.Prompts
		}
		for _, t := range resultTargets(in) {
			mine := resultsOf(in, t)
			if i := slices.IndexFunc(p.Targets, func(x Target) bool { return x.Name == t }); i >= 0 {
				if !sameRecords(resultsOf(s, t), mine) {
					return nil, fmt.Errorf("target %q is in two runs with different requests: leave one of them out", t)
				}
				continue
			}
			p.Targets = append(p.Targets, targetOf(in, t))
			for _, r := range mine {
				c := *r
				s.Results = append(s.Results, &c)
			}
		}
	}
	return s, nil
}

// resultTargets names the targets with results in s, in their order.
func resultTargets(s *Suite) []string {
	var out []string
	for _, r := range s.Results {
		if !slices.Contains(out, r.Target) {
			out = append(out, r.Target)
		}
	}
	return out
}

func resultsOf(s *Suite, target string) []*Result {
	var out []*Result
	for _, r := range s.Results {
		if r.Target == target {
			out = append(out, r)
		}
	}
	return out
}

func targetOf(s *Suite, name string) Target {
	if s.Plan != nil {
		for _, t := range s.Plan.Targets {
			if t.Name == name {
				return t
			}
		}
	}
	return Target{Name: name}
}

func sameRecords(a, b []*Result) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Load != b[i].Load || !reflect.DeepEqual(a[i].Records, b[i].Records) {
			return false
		}
	}
	return true
}

// PooledNote says how many requests each target's attainment at one rate
// pools: all its rounds' ("180 requests per target (3 rounds of 60)"),
// from the requests recorded (fewer where a conversation stopped at a
// failed turn); "" without rate levels.
func PooledNote(s *Suite) string {
	lo, hi := 0, 0
	for _, r := range s.Results {
		if r.Load.Rate <= 0 {
			continue
		}
		n := len(r.Records)
		if lo == 0 || n < lo {
			lo = n
		}
		hi = max(hi, n)
	}
	if hi == 0 {
		return ""
	}
	count := fmt.Sprint(hi)
	if lo != hi {
		count = fmt.Sprintf("%d–%d", lo, hi)
	}
	rounds := max(s.Plan.Rounds, 1)
	if rounds == 1 {
		return fmt.Sprintf("%s requests per target (1 round)", count)
	}
	return fmt.Sprintf("%s requests per target (%d rounds of %d)", count, rounds, RequestsPerLevel(s))
}
