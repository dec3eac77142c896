package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/benchtest"
	"github.com/tandem-serve/tandem/internal/testmodels"
)

// TestBenchAgainstATargetWithoutModelsOrTokenize: `tandem bench` must work
// against a server that has neither /v1/models nor /tokenize (the tandem
// proxy has no /tokenize), here with --model DIR, the README's command
// shape. (bench.Prepare's tests cover the other ways to name a model.)
func TestBenchAgainstATargetWithoutModelsOrTokenize(t *testing.T) {
	dir := testmodels.Stories260K(t)
	t.Run("the README's command shape runs end to end", func(t *testing.T) {
		f, url := benchtest.NewCompletionsOnly(t)
		out := filepath.Join(t.TempDir(), "out.json")
		err := runBench([]string{"--target", "pd=" + url, "--target", "colocated=" + url, "--model", dir, "--workload", "multiturn",
			"--turns", "2", "--think", "1", "--requests", "3", "--rates", "50,100", "--slo-ttft", "1s", "--slo-tpot", "100ms",
			"--progress", "0", "--json", out})
		if err != nil {
			t.Fatal(err)
		}
		var s struct {
			Results []struct {
				Completed int `json:"completed"`
				Failed    int `json:"failed"`
			} `json:"results"`
			Capacity []bench.Capacity `json:"capacity"`
		}
		readJSON(t, out, &s)
		if len(s.Results) != 4 || len(s.Capacity) != 2 || s.Capacity[0].Bound != "at least" {
			t.Fatalf("results %+v, capacity %+v", s.Results, s.Capacity)
		}
		for _, r := range s.Results {
			if r.Completed != 6 || r.Failed != 0 {
				t.Errorf("completed %d failed %d, want 3 conversations × 2 turns", r.Completed, r.Failed)
			}
		}
		if m := f.Models(); m[filepath.Base(dir)] != 24 || len(m) != 1 {
			t.Errorf("model names sent %v, want %q only", f.Models(), filepath.Base(dir))
		}
	})
}

// TestBenchFailsAfterWritingWhenRequestsFail: `tandem bench` against a
// server that refuses some requests writes its table and JSON and then
// exits non-zero naming the failed levels, unless --allow-failures says
// failures are expected; a rate search is held to the same rule.
func TestBenchFailsAfterWritingWhenRequestsFail(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%2 == 0 {
			http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name    string
		extra   []string
		wantErr string
	}{
		{"failures fail the command", nil, "requests failed: 2 of 4 against t at rate 100"},
		{"--allow-failures expects them", []string{"--allow-failures"}, ""},
		{"a rate search fails the same way", []string{"--search", "--search-low", "100", "--search-high", "100", "--slo-ttft", "1s"}, "requests failed: 2 of 4 against t at rate 100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n.Store(0)
			out := filepath.Join(t.TempDir(), "out.json")
			args := append([]string{"--target", "t=" + srv.URL, "--model", "m", "--vocab", "100", "--requests", "4", "--max-tokens", "2",
				"--rate", "100", "--progress", "0", "--json", out}, tc.extra...)
			err := runBench(args)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("err = %v, want %q", err, tc.wantErr)
			}
			var s struct {
				Results []struct {
					Failed int `json:"failed"`
				} `json:"results"`
			}
			readJSON(t, out, &s)
			if len(s.Results) != 1 || s.Results[0].Failed != 2 {
				t.Errorf("results written: %+v, want the one level with its 2 failures", s.Results)
			}
		})
	}
}
