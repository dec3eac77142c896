package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/bench/workload"
)

// fakeServer is a minimal OpenAI-compatible completion server that checks
// the benchmark's requests and records concurrency.
type fakeServer struct {
	t        *testing.T
	failEach int // fail every failEach-th completion with HTTP 503; 0: never
	inFlight atomic.Int32
	peak     atomic.Int32
	mu       sync.Mutex
	prompts  [][]int32
	n        int
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/models":
		fmt.Fprint(w, `{"object":"list","data":[{"id":"tiny","max_model_len":512}]}`)
	case "/tokenize":
		fmt.Fprint(w, `{"count":3,"max_model_len":512,"tokens":[40,41,40,97]}`)
	case "/v1/completions":
		f.complete(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeServer) complete(w http.ResponseWriter, r *http.Request) {
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for p := f.peak.Load(); n > p && !f.peak.CompareAndSwap(p, n); p = f.peak.Load() {
	}
	var req struct {
		Model         string         `json:"model"`
		Prompt        []int32        `json:"prompt"`
		MaxTokens     int            `json:"max_tokens"`
		IgnoreEOS     bool           `json:"ignore_eos"`
		Stream        bool           `json:"stream"`
		StreamOptions map[string]any `json:"stream_options"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if req.Model != "tiny" || !req.IgnoreEOS || !req.Stream || req.StreamOptions["include_usage"] != true {
		f.t.Errorf("unexpected request %+v", req)
	}
	f.mu.Lock()
	f.prompts = append(f.prompts, req.Prompt)
	f.n++
	fail := f.failEach > 0 && f.n%f.failEach == 0
	f.mu.Unlock()
	if fail {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"error":{"message":"overloaded","type":"server_error","code":503}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i := range req.MaxTokens {
		time.Sleep(time.Millisecond)
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"t%d\",\"finish_reason\":null}]}\n\n", i)
		fl.Flush()
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\n", len(req.Prompt), req.MaxTokens)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func TestRunAgainstAFakeServer(t *testing.T) {
	tests := []struct {
		name     string
		loads    []Load
		requests int
		prompt   int
		out      int
		pool     []int32
		failEach int
		wantFail int
		distinct bool // no two requests share a prompt
	}{
		{
			name:  "a closed-loop sweep never exceeds each level's concurrency",
			loads: []Load{{Concurrency: 1}, {Concurrency: 3}}, requests: 6, prompt: 7, out: 3,
			pool: []int32{40, 41, 97},
		},
		{
			name:  "every level gets its own prompts",
			loads: []Load{{Concurrency: 2}, {Concurrency: 2}, {Concurrency: 2}}, requests: 4, prompt: 5, out: 1,
			pool: VocabPool(1000), distinct: true,
		},
		{
			name:  "Poisson arrivals with ids from a small vocabulary",
			loads: []Load{{Rate: 200}}, requests: 5, prompt: 4, out: 2,
			pool: VocabPool(20),
		},
		{
			name:  "failed requests are counted with the server's message",
			loads: []Load{{Concurrency: 2}}, requests: 6, prompt: 3, out: 2,
			pool: []int32{40, 41, 97}, failEach: 3, wantFail: 2,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := &fakeServer{t: t, failEach: tc.failEach}
			srv := httptest.NewServer(fs)
			defer srv.Close()
			p := &Plan{
				Targets: []Target{{"fake", srv.URL}}, Model: "tiny", Loads: tc.loads, Seed: 1, Timeout: 10 * time.Second,
				Workload: workload.Lengths("fixed", 1, tc.requests, workload.Fixed(tc.prompt), workload.Fixed(tc.out), tc.pool), Pool: tc.pool,
			}
			s, err := Run(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Results) != len(tc.loads) {
				t.Fatalf("%d results, want %d", len(s.Results), len(tc.loads))
			}
			for i, r := range s.Results {
				if r.Load != tc.loads[i] || r.Model != "tiny" {
					t.Errorf("result %d: load %v model %q", i, r.Load, r.Model)
				}
				if r.Completed+r.Failed != tc.requests || r.Failed != tc.wantFail {
					t.Errorf("%s: completed %d, failed %d; want %d failed of %d", r.Load, r.Completed, r.Failed, tc.wantFail, tc.requests)
				}
				if r.TotalOutputTokens != r.Completed*tc.out || r.TotalInputTokens != r.Completed*tc.prompt {
					t.Errorf("%s: tokens in %d out %d", r.Load, r.TotalInputTokens, r.TotalOutputTokens)
				}
				if r.TTFT.N != r.Completed || r.ITL.N != r.Completed*(tc.out-1) || r.E2E.P50 <= 0 || r.OutputThroughput <= 0 {
					t.Errorf("%s: implausible latencies %+v", r.Load, r.Report)
				}
				if tc.wantFail > 0 && (len(r.Errors) != 1 || r.Errors[0].Count != tc.wantFail || !strings.Contains(r.Errors[0].Error, "HTTP 503: overloaded")) {
					t.Errorf("%s: errors %+v", r.Load, r.Errors)
				}
			}
			if c := tc.loads[len(tc.loads)-1].Concurrency; c > 0 && int(fs.peak.Load()) > c {
				t.Errorf("peak in flight %d exceeds concurrency %d", fs.peak.Load(), c)
			}
			if tc.distinct {
				seen := map[string]bool{}
				for _, p := range fs.prompts {
					k := fmt.Sprint(p)
					if seen[k] {
						t.Errorf("prompt %v sent twice", p)
					}
					seen[k] = true
				}
			}
			for _, p := range fs.prompts {
				if len(p) != tc.prompt || slices.ContainsFunc(p, func(id int32) bool { return !slices.Contains(tc.pool, id) }) {
					t.Fatalf("prompt %v: want %d ids from %v", p, tc.prompt, tc.pool)
				}
			}
		})
	}
}

func TestPlanCheck(t *testing.T) {
	w := workload.Lengths("fixed", 1, 2, workload.Fixed(4), workload.Fixed(2), testPool)
	tests := []struct {
		name    string
		change  func(*Plan)
		wantErr string
	}{
		{"no target", func(p *Plan) { p.Targets = nil }, "no target"},
		{"two targets of one name", func(p *Plan) { p.Targets = append(p.Targets, p.Targets[0]) }, `two targets are named "a"`},
		{"no model", func(p *Plan) { p.Model = "" }, "no model name"},
		{"no requests", func(p *Plan) { p.Workload = &workload.Workload{} }, "no requests"},
		{"no load", func(p *Plan) { p.Loads = nil }, "no load"},
		{"zero concurrency in a closed loop", func(p *Plan) { p.Loads = []Load{{}} }, "want a positive rate or concurrency"},
		{"no timeout", func(p *Plan) { p.Timeout = 0 }, "timeout must be positive"},
		{"a goal above 1", func(p *Plan) { p.Goal = 1.5 }, "goal 1.5"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := &Plan{Targets: []Target{{"a", "http://127.0.0.1:1"}}, Model: "m", Workload: w, Loads: []Load{{Concurrency: 1}}, Timeout: time.Second}
			tc.change(p)
			_, err := Run(context.Background(), p)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Run = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestTokenPools(t *testing.T) {
	srv := httptest.NewServer(&fakeServer{t: t})
	defer srv.Close()
	c := NewClient(srv.URL, 1)
	if pool, err := TokenPool(context.Background(), c, "tiny", 0); err != nil || !cmp.Equal(pool, []int32{40, 41, 97}) {
		t.Errorf("pool through /tokenize = %v, %v; want the distinct ids [40 41 97]", pool, err)
	}
	if pool, err := TokenPool(context.Background(), c, "tiny", 20); err != nil || !cmp.Equal(pool, seq32(10, 20)) {
		t.Errorf("pool of --vocab 20 = %v, %v", pool, err)
	}
	if pool := VocabPool(5); !cmp.Equal(pool, seq32(0, 5)) {
		t.Errorf("VocabPool(5) = %v: a vocabulary of 10 or fewer ids is used whole", pool)
	}
	if pool := DefaultPool(); len(pool) != 256 || pool[0] != DefaultPoolLow || pool[255] != DefaultPoolHigh-1 {
		t.Errorf("DefaultPool = %v", pool)
	}
	if _, err := TokenPool(context.Background(), NewClient("http://127.0.0.1:1", 1), "tiny", 0); err == nil || !strings.Contains(err.Error(), "/tokenize") {
		t.Errorf("no server: %v", err)
	}
}

func TestPromptsAndArrivalsArePureFunctionsOfTheSeed(t *testing.T) {
	pool := []int32{3, 5, 8}
	if !cmp.Equal(Prompts(4, 0, 3, 10, pool), Prompts(4, 0, 3, 10, pool)) {
		t.Error("same seed, different prompts")
	}
	if cmp.Equal(Prompts(4, 0, 3, 10, pool), Prompts(5, 0, 3, 10, pool)) {
		t.Error("different seeds, same prompts")
	}
	if cmp.Equal(Prompts(4, 0, 3, 10, pool), Prompts(4, 1, 3, 10, pool)) {
		t.Error("different streams, same prompts")
	}
	a := Arrivals(1, 20000, 50)
	if !cmp.Equal(a, Arrivals(1, 20000, 50)) || a[0] != 0 || !slices.IsSorted(a) {
		t.Fatal("arrivals not reproducible, not starting at 0 or not increasing")
	}
	// The mean gap of a Poisson process at 50/s is 20ms (within 3% here).
	mean := a[len(a)-1].Seconds() / float64(len(a)-1)
	if math.Abs(mean-0.02) > 0.0006 {
		t.Errorf("mean inter-arrival %.5fs, want 0.02s", mean)
	}
}

func TestParseConcurrencies(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr bool
	}{
		{"1,4,16", []int{1, 4, 16}, false},
		{" 2 , 8 ", []int{2, 8}, false},
		{"4", []int{4}, false},
		{"1,,4", nil, true},
		{"0", nil, true},
		{"-1", nil, true},
		{"4x", nil, true},
		{"", nil, true},
	}
	for _, tc := range tests {
		got, err := ParseConcurrencies(tc.in)
		if (err != nil) != tc.wantErr || !cmp.Equal(got, tc.want) {
			t.Errorf("ParseConcurrencies(%q) = %v, %v; want %v (error %v)", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func seq32(from, to int32) []int32 {
	var s []int32
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

func TestStreamTimesOutAStalledServer(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":null}]}\n\n")
		w.(http.Flusher).Flush()
		select { // then stall
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	o := NewClient(srv.URL, 1).Stream(ctx, CompletionRequest{Model: "m", Prompt: []int32{1}, MaxTokens: 4})
	if o.Err == nil || !strings.Contains(o.Err.Error(), "deadline exceeded") {
		t.Errorf("Err = %v, want a deadline error", o.Err)
	}
	// The request starts a little after the context, so E2E is a little
	// under the 100ms deadline; it must still show the stall.
	if o.TTFT <= 0 || o.E2E < 50*time.Millisecond || o.E2E < o.TTFT {
		t.Errorf("TTFT %v, E2E %v: want the first token timed and E2E near the deadline", o.TTFT, o.E2E)
	}
}
