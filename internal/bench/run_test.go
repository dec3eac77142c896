package bench

import (
	"bytes"
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

func TestRunAllAgainstAFakeServer(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Config
		failEach  int
		wantLevel []int
		wantFail  int
		wantPool  []int32
		distinct  bool // no two requests share a prompt
	}{
		{
			name:      "a closed-loop sweep never exceeds each level's concurrency",
			cfg:       Config{Concurrencies: []int{1, 3}, Requests: 6, PromptTokens: 7, MaxTokens: 3},
			wantLevel: []int{1, 3},
			wantPool:  []int32{40, 41, 97},
		},
		{
			name:      "every level and the probe get their own prompts",
			cfg:       Config{Concurrencies: []int{2, 2, 2}, Requests: 4, PromptTokens: 5, MaxTokens: 1, Vocab: 1000},
			wantLevel: []int{2, 2, 2},
			wantPool:  seq32(10, 1000),
			distinct:  true,
		},
		{
			name:      "Poisson arrivals with ids from --vocab",
			cfg:       Config{Concurrencies: []int{0}, Requests: 5, PromptTokens: 4, MaxTokens: 2, Rate: 200, Vocab: 20},
			wantLevel: []int{0},
			wantPool:  []int32{10, 11, 12, 13, 14, 15, 16, 17, 18, 19},
		},
		{
			name:      "failed requests are counted with the server's message",
			cfg:       Config{Concurrencies: []int{2}, Requests: 6, PromptTokens: 3, MaxTokens: 2},
			failEach:  3, // the probe is request 1; requests 3 and 6 of the level fail
			wantLevel: []int{2},
			wantFail:  2,
			wantPool:  []int32{40, 41, 97},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := &fakeServer{t: t, failEach: tc.failEach}
			srv := httptest.NewServer(fs)
			defer srv.Close()
			cfg := tc.cfg
			cfg.URL, cfg.Seed, cfg.Timeout = srv.URL, 1, 10*time.Second
			reports, err := RunAll(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			var levels []int
			for _, r := range reports {
				levels = append(levels, r.Concurrency)
				if r.Completed+r.Failed != cfg.Requests || r.Failed != tc.wantFail {
					t.Errorf("level %d: completed %d, failed %d; want %d failed of %d", r.Concurrency, r.Completed, r.Failed, tc.wantFail, cfg.Requests)
				}
				if r.TotalOutputTokens != r.Completed*cfg.MaxTokens || r.TotalInputTokens != r.Completed*cfg.PromptTokens {
					t.Errorf("level %d: tokens in %d out %d", r.Concurrency, r.TotalInputTokens, r.TotalOutputTokens)
				}
				if r.TTFT.N != r.Completed || r.ITL.N != r.Completed*(cfg.MaxTokens-1) || r.E2E.P50 <= 0 || r.OutputThroughput <= 0 {
					t.Errorf("level %d: implausible latencies %+v", r.Concurrency, r)
				}
				if tc.wantFail > 0 && (len(r.Errors) != 1 || r.Errors[0].Count != tc.wantFail || !strings.Contains(r.Errors[0].Error, "HTTP 503: overloaded")) {
					t.Errorf("level %d: errors %+v", r.Concurrency, r.Errors)
				}
				var buf bytes.Buffer
				if err := r.WriteText(&buf); err != nil || !strings.Contains(buf.String(), "TTFT") {
					t.Errorf("WriteText = %q, %v", buf.String(), err)
				}
			}
			if diff := cmp.Diff(tc.wantLevel, levels); diff != "" {
				t.Errorf("levels (-want +got):\n%s", diff)
			}
			if c := cfg.Concurrencies[len(cfg.Concurrencies)-1]; c > 0 && int(fs.peak.Load()) > c {
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
				if len(p) != cfg.PromptTokens || slices.ContainsFunc(p, func(id int32) bool { return !slices.Contains(tc.wantPool, id) }) {
					t.Fatalf("prompt %v: want %d ids from %v", p, cfg.PromptTokens, tc.wantPool)
				}
			}
		})
	}
}

func TestRunAllFailsFastOnABadSetup(t *testing.T) {
	srv := httptest.NewServer(&fakeServer{t: t})
	defer srv.Close()
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr string
	}{
		{"unknown model", func(c *Config) { c.Model = "big" }, `model "big" is not served`},
		{"lengths beyond the context", func(c *Config) { c.PromptTokens, c.MaxTokens = 500, 100 }, "exceed the model's context of 512"},
		{"no server", func(c *Config) { c.URL = "http://127.0.0.1:1" }, "listing models"},
		{"no requests", func(c *Config) { c.Requests = 0 }, "--requests must be at least 1"},
		{"zero concurrency in a closed loop", func(c *Config) { c.Concurrencies = []int{0} }, "concurrency 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{URL: srv.URL, Concurrencies: []int{1}, Requests: 1, PromptTokens: 4, MaxTokens: 2, Timeout: 5 * time.Second}
			tc.change(&cfg)
			_, err := RunAll(context.Background(), cfg)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("RunAll = %v, want an error containing %q", err, tc.wantErr)
			}
		})
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
