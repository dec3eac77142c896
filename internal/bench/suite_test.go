package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/bench/workload"
	"github.com/tandem-serve/tandem/internal/progress"
)

func TestSLOArithmeticByHand(t *testing.T) {
	ms := time.Millisecond
	recs := []Record{
		// TPOT = (E2E-TTFT)/(out-1) = (1000-100)/9 = 100 ms.
		{TTFT: 100 * ms, E2E: 1000 * ms, OutputTokens: 10, ITL: []time.Duration{100 * ms, 100 * ms}},
		// TTFT misses 200 ms; TPOT (500-300)/4 = 50 ms.
		{TTFT: 300 * ms, E2E: 500 * ms, OutputTokens: 5, ITL: []time.Duration{50 * ms}},
		// TPOT (1100-100)/4 = 250 ms misses 150 ms.
		{TTFT: 100 * ms, E2E: 1100 * ms, OutputTokens: 5, ITL: []time.Duration{250 * ms}},
		// Meets TTFT and TPOT (mean 40 ms) but one 400 ms stall.
		{TTFT: 50 * ms, E2E: 50*ms + 400*ms + 9*40*ms - 40*ms, OutputTokens: 11, ITL: []time.Duration{400 * ms, 10 * ms}},
		// A failure is a miss, however fast.
		{TTFT: 1 * ms, E2E: 2 * ms, OutputTokens: 2, Err: "HTTP 500: boom"},
	}
	cases := []struct {
		name string
		slo  SLO
		want int
	}{
		{"no objective counts every success", SLO{}, 4},
		{"TTFT 200 ms alone", SLO{TTFT: 200 * ms}, 3},
		{"TTFT 200 ms and TPOT 150 ms", SLO{TTFT: 200 * ms, TPOT: 150 * ms}, 2},
		{"adding every ITL 300 ms drops the stalled stream", SLO{TTFT: 200 * ms, TPOT: 150 * ms, ITL: 300 * ms}, 1},
		{"a TPOT bound exactly at a request's TPOT is met", SLO{TPOT: 100 * ms}, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			frac, met := Attainment(tc.slo, recs)
			if met != tc.want || math.Abs(frac-float64(tc.want)/5) > 1e-12 {
				t.Errorf("met %d (%.2f), want %d of 5", met, frac, tc.want)
			}
		})
	}
	// Goodput is met requests per second of the level: 2 met in 4 s = 0.5/s.
	r := &Result{Records: recs, Load: Load{Rate: 1}}
	r.summarize(&Plan{Model: "m", SLO: SLO{TTFT: 200 * ms, TPOT: 150 * ms}}, 4*time.Second)
	if r.Goodput != 0.5 || r.Attained != 0.4 {
		t.Errorf("goodput %v attainment %v, want 0.5 req/s and 0.4", r.Goodput, r.Attained)
	}
	if len(r.Curve) != len(SLOScales) || r.Curve[2].Attainment != 0.4 || r.Curve[4].Attainment != 0.8 {
		t.Errorf("curve %+v: want 40%% at ×1 and 80%% at ×4", r.Curve)
	}
	if r.Failed != 1 || r.Paths["none"] != 5 {
		t.Errorf("failed %d paths %v", r.Failed, r.Paths)
	}
}

func TestGammaArrivalsHaveTheRateAndBurstiness(t *testing.T) {
	for _, b := range []float64{0.25, 1, 4} {
		a := GammaArrivals(7, 20001, 10, b)
		var sum, sq float64
		for i := 1; i < len(a); i++ {
			g := (a[i] - a[i-1]).Seconds()
			sum += g
			sq += g * g
		}
		n := float64(len(a) - 1)
		mean := sum / n
		cv := math.Sqrt(sq/n-mean*mean) / mean
		if math.Abs(mean-0.1) > 0.005 || math.Abs(cv-1/math.Sqrt(b)) > 0.08/math.Sqrt(b) {
			t.Errorf("burstiness %v: mean gap %.4f s (want 0.1), CV %.3f (want %.3f)", b, mean, cv, 1/math.Sqrt(b))
		}
	}
}

// latencyServer is an OpenAI-style streaming completion server with a latency
// model: prefills run one at a time for prefill each (a single prefill
// engine), then tokens stream every tpot. It records conversation ids.
type latencyServer struct {
	prefill, tpot time.Duration
	mu            sync.Mutex // the one prefill engine
	seen          sync.Map   // conversation_id -> prompt lengths
}

func (f *latencyServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt         []int32 `json:"prompt"`
		MaxTokens      int     `json:"max_tokens"`
		ConversationID string  `json:"conversation_id"`
		Model          string  `json:"model"`
	}
	if r.URL.Path != "/v1/completions" || json.NewDecoder(r.Body).Decode(&req) != nil || req.Model == "" {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	if req.ConversationID != "" {
		v, _ := f.seen.LoadOrStore(req.ConversationID, &[]int{})
		f.mu.Lock()
		*v.(*[]int) = append(*v.(*[]int), len(req.Prompt))
		f.mu.Unlock()
	}
	f.mu.Lock()
	time.Sleep(f.prefill)
	f.mu.Unlock()
	w.Header().Set("X-Tandem-Pd", "remote")
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i := range req.MaxTokens {
		if i > 0 {
			time.Sleep(f.tpot)
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"t%d \"}]}\n\n", i)
		fl.Flush()
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", len(req.Prompt), req.MaxTokens)
}

var testPool = []int32{11, 12, 13, 14, 15}

func TestRunTwoTargetsWithConversations(t *testing.T) {
	fa, fb := &latencyServer{prefill: time.Millisecond, tpot: time.Millisecond}, &latencyServer{prefill: 3 * time.Millisecond, tpot: time.Millisecond}
	a, b := httptest.NewServer(fa), httptest.NewServer(fb)
	defer a.Close()
	defer b.Close()
	w := workload.MultiTurn(1, 4, workload.Fixed(3), workload.Fixed(8), workload.Fixed(4), workload.Fixed(5), testPool)
	var progressOut strings.Builder
	p := &Plan{
		Targets: []Target{{"a", a.URL}, {"b", b.URL}}, Model: "m", Workload: w,
		Loads: []Load{{Concurrency: 2}, {Rate: 50}}, Rounds: 2, Timeout: 10 * time.Second,
		SLO: SLO{TTFT: time.Second}, Pool: testPool, Progress: progress.NewWriter(&progressOut, progress.Options{Every: time.Hour}),
	}
	s, err := Run(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Results) != 4 {
		t.Fatalf("%d results, want 2 loads × 2 targets", len(s.Results))
	}
	for _, r := range s.Results {
		if r.Completed != 24 || r.Failed != 0 || r.Paths["remote"] != 24 || r.Attained != 1 || r.TotalOutputTokens != 96 {
			t.Errorf("%s %s: completed %d failed %d paths %v attained %v out %d", r.Target, r.Load, r.Completed, r.Failed, r.Paths, r.Attained, r.TotalOutputTokens)
		}
	}
	// Every turn's prompt is the history: 8, 8+4+8, 8+4+8+4+8.
	n := 0
	fa.seen.Range(func(k, v any) bool {
		n++
		got := *v.(*[]int)
		want := []int{8, 20, 32} // each level (load and round) has its own conversation ids
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("conversation %v prompts %v, want %v", k, got, want)
		}
		return true
	})
	if n != 16 {
		t.Errorf("%d conversation ids seen, want 4 conversations × 2 loads × 2 rounds", n)
	}
	var tbl strings.Builder
	if err := WriteTable(&tbl, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"conc 2", "rate 50", "remote 24", "SLO attainment at SLO scale", "round 2/2"} {
		if !strings.Contains(tbl.String()+progressOut.String(), want) {
			t.Errorf("output lacks %q:\n%s\n%s", want, tbl.String(), progressOut.String())
		}
	}
}

// recordingServer answers completions at once and records every prompt,
// with its conversation id, in the order received.
type recordingServer struct {
	mu      sync.Mutex
	prompts [][]int32
	convs   []string
}

func (f *recordingServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt         []int32 `json:"prompt"`
		MaxTokens      int     `json:"max_tokens"`
		ConversationID string  `json:"conversation_id"`
	}
	if r.URL.Path != "/v1/completions" || json.NewDecoder(r.Body).Decode(&req) != nil {
		http.NotFound(w, r)
		return
	}
	f.mu.Lock()
	f.prompts = append(f.prompts, req.Prompt)
	f.convs = append(f.convs, req.ConversationID)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range req.MaxTokens {
		fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"t%d \"}]}\n\n", i)
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", len(req.Prompt), req.MaxTokens)
}

// TestEveryLevelGetsFreshPromptsAndTheTargetsTheSame runs workloads that
// share on purpose (shared-prefix groups, multi-turn histories, a trace's
// prefix blocks) at two loads in two rounds against two targets: every
// level (load, round) must send prompts no other level's share a first KV
// block with (else a prefix cache serves them), both targets of a level the
// same prompts, and the workload's own sharing must stay within the level.
func TestEveryLevelGetsFreshPromptsAndTheTargetsTheSame(t *testing.T) {
	const block = 16
	pool := VocabPool(1000)
	prefix, err := workload.SharedPrefix(5, 8, 2, 32, workload.Dist{Kind: "uniform", A: 4, B: 12, Min: 4, Max: 12}, workload.Fixed(2), pool)
	if err != nil {
		t.Fatal(err)
	}
	trace, err := workload.ReadTrace(strings.NewReader(`{"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [1, 2]}
{"timestamp": 1, "input_length": 36, "output_length": 2, "hash_ids": [1, 3]}
{"timestamp": 2, "input_length": 20, "output_length": 2, "hash_ids": [2]}
{"timestamp": 3, "input_length": 18, "output_length": 2}`), "t.jsonl", workload.TraceOptions{BlockTokens: block}, 5, pool)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		w    *workload.Workload
		// shares checks the sharing the workload means within one level's
		// prompts (in the order one server received them) and ids.
		shares func(t *testing.T, prompts [][]int32, convs []string)
	}{
		{"shared-prefix groups keep their system prompts", prefix, func(t *testing.T, prompts [][]int32, _ []string) {
			prefixes := map[string]bool{}
			for _, pr := range prompts {
				prefixes[fmt.Sprint(pr[:32])] = true
			}
			if len(prefixes) != 2 {
				t.Errorf("%d distinct 32-token prefixes, want the workload's 2 groups", len(prefixes))
			}
		}},
		{"conversations extend their own history", workload.MultiTurn(5, 3, workload.Fixed(3), workload.Fixed(block), workload.Fixed(2), workload.Fixed(1), pool),
			func(t *testing.T, prompts [][]int32, convs []string) {
				last := map[string][]int32{}
				for i, pr := range prompts {
					if prev, ok := last[convs[i]]; ok && !slices.Equal(pr[:len(prev)], prev) {
						t.Errorf("conversation %s: a turn does not start with the previous turn's prompt", convs[i])
					}
					last[convs[i]] = pr
				}
				if len(last) != 3 {
					t.Errorf("%d conversation ids in a level, want 3", len(last))
				}
			}},
		{"a trace's equal hash ids stay equal blocks", trace, func(t *testing.T, prompts [][]int32, _ []string) {
			byLen := map[int][]int32{}
			for _, pr := range prompts {
				byLen[len(pr)] = pr
			}
			h1a, h1b := byLen[40][:block], byLen[36][:block]
			h2a, h2b := byLen[40][block:2*block], byLen[20][:block]
			if !slices.Equal(h1a, h1b) || !slices.Equal(h2a, h2b) || slices.Equal(h1a, h2a) {
				t.Errorf("hash 1 blocks %v and %v, hash 2 blocks %v and %v: want each hash's blocks equal, the two different", h1a, h1b, h2a, h2b)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fa, fb := &recordingServer{}, &recordingServer{}
			a, b := httptest.NewServer(fa), httptest.NewServer(fb)
			defer a.Close()
			defer b.Close()
			p := &Plan{
				Targets: []Target{{"a", a.URL}, {"b", b.URL}}, Model: "m", Workload: tc.w, Pool: pool,
				Loads: []Load{{Concurrency: 3}, {Rate: 200}}, Rounds: 2, Timeout: 10 * time.Second,
			}
			if _, err := Run(context.Background(), p); err != nil {
				t.Fatal(err)
			}
			levels, requests := p.Levels(), tc.w.Requests()
			if len(fa.prompts) != levels*requests || len(fb.prompts) != levels*requests {
				t.Fatalf("%d and %d prompts, want %d each", len(fa.prompts), len(fb.prompts), levels*requests)
			}
			// Levels run one after another, each to its end, so each server
			// saw its requests in level order, requests at a time.
			sorted := func(f *recordingServer, k int) []string {
				var out []string
				for _, pr := range f.prompts[k*requests : (k+1)*requests] {
					out = append(out, fmt.Sprint(pr))
				}
				slices.Sort(out)
				return out
			}
			firstBlocks := map[string]int{} // a first block -> the level that sent it
			for k := range levels {
				if !slices.Equal(sorted(fa, k), sorted(fb, k)) {
					t.Errorf("level %d: the targets got different prompts", k)
				}
				level := fa.prompts[k*requests : (k+1)*requests]
				for _, pr := range level {
					fb := fmt.Sprint(pr[:block])
					if l, ok := firstBlocks[fb]; ok && l != k {
						t.Errorf("level %d sends a first block level %d sent: %v", k, l, pr[:block])
					}
					firstBlocks[fb] = k
					if slices.ContainsFunc(pr, func(id int32) bool { return !slices.Contains(pool, id) }) {
						t.Errorf("level %d: prompt %v has ids outside the pool", k, pr)
					}
				}
				t.Run(fmt.Sprintf("level %d", k), func(t *testing.T) { tc.shares(t, level, fa.convs[k*requests:(k+1)*requests]) })
			}
		})
	}
}

func TestSearchRateFindsTheKneeOfAFakeTarget(t *testing.T) {
	// One prefill at a time, 20 ms each: capacity 50 req/s. With TTFT ≤
	// 100 ms for 90% of requests, the M/D/1 queue allows roughly 30–45
	// req/s; the search must land between 10 and 50. The objective leaves
	// 80 ms for the host's scheduling delays at low rates: CI's two cores
	// run other test packages beside this one (with 10 ms and 40 ms it
	// found no rate at all under a load average of 14).
	f := &latencyServer{prefill: 20 * time.Millisecond, tpot: time.Millisecond}
	srv := httptest.NewServer(f)
	defer srv.Close()
	p := &Plan{
		Targets: []Target{{"fake", srv.URL}}, Model: "m", Loads: []Load{{Rate: 1}},
		Workload: workload.Lengths("fixed", 1, 50, workload.Fixed(4), workload.Fixed(3), testPool),
		Timeout:  10 * time.Second, SLO: SLO{TTFT: 100 * time.Millisecond},
	}
	var observed []float64
	observe := func(target string, rate float64) func(*Result) {
		return func(r *Result) {
			if target != "fake" || r.Load.Rate != rate {
				t.Errorf("observed %s at %v, got the result of %s at %v", target, rate, r.Target, r.Load.Rate)
			}
			observed = append(observed, rate)
		}
	}
	res, err := SearchRate(context.Background(), p, SearchConfig{Target: 0.9, Low: 10, High: 200, Steps: 2, Observe: observe}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := res[0]
	var tried []float64
	for _, pt := range got.Points {
		tried = append(tried, pt.Rate)
	}
	if !slices.Equal(observed, tried) {
		t.Errorf("Observe saw rates %v, the search tried %v", observed, tried)
	}
	t.Logf("max rate %.1f, points %+v", got.MaxRate, got.Points)
	if got.MaxRate < 10 || got.MaxRate > 50 {
		t.Errorf("max rate %.1f req/s, want 10–50 for a 50 req/s server", got.MaxRate)
	}
	if last := got.Points[len(got.Points)-1]; len(got.Points) < 4 || last.Rate <= 0 {
		t.Errorf("points %+v", got.Points)
	}
	if _, err := SearchRate(context.Background(), &Plan{}, SearchConfig{Target: 0.9, Low: 1, High: 2}, nil); err == nil {
		t.Error("a search without an SLO was accepted")
	}
}

func TestParseTarget(t *testing.T) {
	if tg, err := ParseTarget("pd=http://127.0.0.1:8000/"); err != nil || tg != (Target{"pd", "http://127.0.0.1:8000"}) {
		t.Errorf("%+v %v", tg, err)
	}
	if tg, err := ParseTarget("http://h:1"); err != nil || tg.Name != "h:1" {
		t.Errorf("%+v %v", tg, err)
	}
	for _, bad := range []string{"pd=localhost:8000", "=http://x", "x"} {
		if _, err := ParseTarget(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestFirstLevelKeepsSeparateRunsApart: two runs of one workload (a tuning
// run, then the measured one) numbered apart by FirstLevel send no prompt
// sharing a first block; numbered alike they repeat every prompt.
func TestFirstLevelKeepsSeparateRunsApart(t *testing.T) {
	pool := VocabPool(1000)
	w := workload.Lengths("fixed", 1, 4, workload.Fixed(16), workload.Fixed(1), pool)
	send := func(first int) map[string]bool {
		f := &recordingServer{}
		srv := httptest.NewServer(f)
		defer srv.Close()
		p := &Plan{Targets: []Target{{"a", srv.URL}}, Model: "m", Workload: w, Pool: pool, Loads: []Load{{Concurrency: 2}}, Rounds: 2, Timeout: 10 * time.Second, FirstLevel: first}
		if _, err := Run(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, pr := range f.prompts {
			seen[fmt.Sprint(pr)] = true
		}
		return seen
	}
	tuning, measured, again := send(0), send(2), send(0)
	for pr := range measured {
		if tuning[pr] {
			t.Errorf("prompt %s sent by both runs", pr)
		}
	}
	if len(tuning) != 8 || !maps.Equal(tuning, again) {
		t.Errorf("%d distinct prompts; the same numbering should repeat them", len(tuning))
	}
}

func TestSearchRateWithADurationSendsRateTimesDurationRequests(t *testing.T) {
	f := &latencyServer{prefill: time.Millisecond, tpot: time.Millisecond}
	srv := httptest.NewServer(f)
	defer srv.Close()
	p := &Plan{
		Targets: []Target{{"fake", srv.URL}}, Model: "m", Loads: []Load{{Rate: 1}},
		Workload: workload.Lengths("fixed", 1, 200, workload.Fixed(4), workload.Fixed(3), testPool),
		Timeout:  10 * time.Second, SLO: SLO{TTFT: time.Second},
	}
	// Every rate meets a 1 s TTFT: 50, 100, 200 req/s are tried, for 0.25 s
	// each: 15 (the minimum, above 12.5), 25 and 50 requests.
	res, err := SearchRate(context.Background(), p, SearchConfig{Target: 0.9, Low: 50, High: 200, Duration: 250 * time.Millisecond, MinRequests: 15}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, r := range res[0].Results {
		got = append(got, len(r.Records))
	}
	if want := []int{15, 25, 50}; !slices.Equal(got, want) {
		t.Errorf("requests per rate %v, want %v", got, want)
	}
	if p.Workload.Requests() != 200 {
		t.Errorf("the plan's workload was cut to %d requests", p.Workload.Requests())
	}
}
