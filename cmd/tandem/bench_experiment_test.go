package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/bench/experiment"
	"github.com/tandem-serve/tandem/internal/testmodels"
)

// actAsTandem, set in the environment, makes the test binary run as the
// tandem command: the experiment starts os.Executable() as its engines and
// proxy, which under `go test` is this binary.
const actAsTandem = "TANDEM_CMD_TEST_ACT_AS_TANDEM"

func TestMain(m *testing.M) {
	if os.Getenv(actAsTandem) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestBenchExperimentPDEndToEnd runs the experiment command in a short form
// on stories260K: it tunes two chunk budgets, starts a colocated engine and
// 1P+1D behind a proxy as processes, runs both workloads against both in
// alternating rounds, and writes the report, the JSON and the plots.
func TestBenchExperimentPDEndToEnd(t *testing.T) {
	dir := testmodels.Stories260K(t)
	t.Setenv(actAsTandem, "1")
	out := t.TempDir()
	stdout, stderr, err := captureOutput(t, func() error {
		return runBenchExperiment([]string{"pd", "--model", dir, "--out", out, "--requests", "3", "--rounds", "2", "--configs", "colocated,pd",
			"--chat-rates", "6", "--long-rates", "4,8", "--mnbt-sweep", "32,256", "--tune-requests", "2", "--max-context", "256"})
	})
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	checkPlain(t, stdout, stderr, `(?m)^(colocated|pd) rate 6 round 2/2: 3/3 requests in `)
	b, err := os.ReadFile(filepath.Join(out, "report.txt"))
	if err != nil {
		t.Fatal(err)
	}
	report := string(b)
	for _, want := range []string{"chosen:", "== workload chat", "== workload long", "colocated  rate 4", "remote 6", "P/D time breakdown",
		"TTFT breakdown per request from the answers' Server-Timing headers", "prefill_leg", "kv_pull",
		"load average (1 min) during the workload", "Goodput rate: the highest tested arrival rate", "goodput rate ≥ 8 req/s", "peak throughput",
		"per rate: 4: ", "P:D ratio model", "prefill engine:", "decode engine:", "Little's law"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	if strings.Contains(report, "does not exist") || strings.Contains(report, "not built") {
		t.Errorf("the report still says a configuration is missing:\n%s", report)
	}
	if strings.Contains(report, "FAILED") {
		t.Errorf("the report names failed requests:\n%s", report)
	}
	for _, wl := range []string{"chat", "long"} {
		var s struct {
			Results []struct {
				Target    string `json:"target"`
				Completed int    `json:"completed"`
				Failed    int    `json:"failed"`
				Records   []struct {
					Timing map[string]float64 `json:"server_timing_ms"`
				} `json:"records"`
			} `json:"results"`
			Capacity []struct {
				Target string `json:"target"`
				Bound  string `json:"bound"`
			} `json:"capacity"`
		}
		readJSON(t, filepath.Join(out, "results-"+wl+".json"), &s)
		if len(s.Results) == 0 {
			t.Fatalf("%s: no results", wl)
		}
		for _, r := range s.Results {
			if r.Failed != 0 || r.Completed != 6 || len(r.Records) != 6 {
				t.Errorf("%s %s: %d completed, %d failed, %d records; want 6, none and 6", wl, r.Target, r.Completed, r.Failed, len(r.Records))
			}
			// Every answer's Server-Timing: the engine's queue and prefill,
			// through the proxy also its prefill leg and overhead and the
			// decode's KV pull.
			want := []string{"queue", "prefill"}
			if r.Target == "pd" {
				want = append(want, "kv_pull", "prefill_leg", "proxy")
			}
			for i, rec := range r.Records {
				for _, k := range want {
					if _, ok := rec.Timing[k]; !ok {
						t.Errorf("%s %s record %d: Server-Timing %v lacks %s", wl, r.Target, i, rec.Timing, k)
					}
				}
				if _, ok := rec.Timing["kv_pull"]; ok && r.Target == "colocated" {
					t.Errorf("%s colocated record %d pulled KV: %v", wl, i, rec.Timing)
				}
			}
		}
		if len(s.Capacity) != 2 || s.Capacity[0].Bound == "" {
			t.Errorf("%s: capacity %+v, want one per configuration", wl, s.Capacity)
		}
	}
	var sum experiment.PDSummary
	readJSON(t, filepath.Join(out, "summary.json"), &sum)
	if len(sum.Workloads) != 2 || len(sum.Workloads[1].Capacity) != 2 || sum.Workloads[1].Capacity[0].PeakOutputThroughput <= 0 ||
		len(sum.Workloads[1].Capacity[0].Points) != 2 || sum.Workloads[1].Capacity[0].Points[0].OutputThroughput <= 0 ||
		len(sum.Workloads[1].Breakdowns) != 4 || len(sum.PDModels) != 2 || sum.PDModels[1].PrefillSeconds <= 0 || len(sum.Failed) != 0 {
		t.Errorf("summary.json: %+v", sum)
	}
	for _, f := range []string{"results-chat.json", "results-long.json", "long-vs-rate.png", "long-vs-rate.svg", "chat-latency-cdf.png", "long-itl-over-time.svg"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s missing or empty: %v", f, err)
		}
	}
	// The grid of goodput rates over scaled TTFT × TPOT objectives: 5×5
	// cells, each with both configurations.
	if !strings.Contains(report, "goodput rate under each pair of objectives") || !strings.Contains(report, "TTFT SLO \\ TPOT SLO") {
		t.Errorf("report lacks the SLO grid:\n%s", report)
	}
	for _, ws := range sum.Workloads {
		if len(ws.Grid) != 25 || len(ws.Grid[0].Capacities) != 2 {
			t.Errorf("%s: SLO grid of %d cells, want 25 with 2 configurations each", ws.Name, len(ws.Grid))
		}
	}
	// tandem bench report re-reads the saved run: under its own SLO it
	// finds the experiment's goodput rates; under an impossible TTFT
	// objective, none.
	var again bytes.Buffer
	if err := benchReport(&again, []string{filepath.Join(out, "results-long.json")}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(again.String(), "goodput rate ≥ 8 req/s") || !strings.Contains(again.String(), "pd  rate 4") {
		t.Errorf("tandem bench report of the saved run:\n%s", again.String())
	}
	again.Reset()
	if err := benchReport(&again, []string{"--slo-ttft", "1us", filepath.Join(out, "results-long.json")}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(again.String(), "goodput rate < 4 req/s"); got != 2 || !strings.Contains(again.String(), "TTFT ≤ 1µs") {
		t.Errorf("tandem bench report --slo-ttft 1us: %d configurations below the lowest rate, want 2:\n%s", got, again.String())
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestBenchExperimentConditional runs the conditional configuration (1P+1D
// behind a proxy with --pd-decider conditional --policy prefix) beside pd on
// the chat mix: with a threshold inside the prompts' range, some requests are
// prefilled by the decode engine (local) and the others remotely, while pd
// sends every one remote.
func TestBenchExperimentConditional(t *testing.T) {
	dir := testmodels.Stories260K(t)
	t.Setenv(actAsTandem, "1")
	out := t.TempDir()
	err := runBenchExperiment([]string{"pd", "--model", dir, "--out", out, "--configs", "pd,conditional", "--workloads", "chat",
		"--chat-rates", "8", "--requests", "6", "--rounds", "1", "--pd-threshold", "100", "--mnbt-sweep", "256", "--max-context", "256"})
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Results []struct {
			Target string         `json:"target"`
			Failed int            `json:"failed"`
			Paths  map[string]int `json:"pd_paths"`
		} `json:"results"`
	}
	readJSON(t, filepath.Join(out, "results-chat.json"), &s)
	if len(s.Results) != 2 {
		t.Fatalf("%d results, want pd and conditional", len(s.Results))
	}
	for _, r := range s.Results {
		if r.Failed != 0 {
			t.Errorf("%s: %d failed", r.Target, r.Failed)
		}
		switch r.Target {
		case "pd":
			if r.Paths["remote"] != 6 {
				t.Errorf("pd paths %v, want every request remote", r.Paths)
			}
		case "conditional":
			if r.Paths["local"] == 0 || r.Paths["remote"] == 0 || r.Paths["local"]+r.Paths["remote"] != 6 {
				t.Errorf("conditional paths %v, want short prompts local and long ones remote", r.Paths)
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(out, "report.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "means over the conditional configuration's requests") {
		t.Errorf("no breakdown for the conditional configuration:\n%s", b)
	}
}

// TestBenchExperimentColocatedCadence runs the fourth configuration,
// colocated-cadence, beside colocated: with one chunk budget there is no
// budget tuning, the prefill cadence is tuned over two intervals at that
// budget, the chosen one runs (its engine's counters show steps deferred:
// 8-token chunks of the chat mix's prompts beside other requests'
// decodes), and both configurations share the SLO grid.
func TestBenchExperimentColocatedCadence(t *testing.T) {
	dir := testmodels.Stories260K(t)
	t.Setenv(actAsTandem, "1")
	out := t.TempDir()
	err := runBenchExperiment([]string{"pd", "--model", dir, "--out", out, "--configs", "colocated,colocated-cadence", "--workloads", "chat",
		"--chat-rates", "8,16", "--requests", "6", "--rounds", "1", "--mnbt-sweep", "8", "--interval-sweep", "2,4", "--tune-requests", "2", "--max-context", "512"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "report.txt"))
	if err != nil {
		t.Fatal(err)
	}
	report := string(b)
	for _, want := range []string{"tuning the colocated engine's --prefill-schedule-interval at --max-num-batched-tokens 8 on the chat workload",
		"--prefill-schedule-interval     2: SLO met", "--prefill-schedule-interval     4: SLO met", "chosen:", "configurations: colocated, colocated-cadence;",
		"colocated-cadence (--prefill-schedule-interval ", "steps deferred prefill while requests decoded", "goodput rate under each pair of objectives"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	if !regexp.MustCompile(`colocated-cadence +rate 16 +6 +0 `).MatchString(report) {
		t.Errorf("report lacks colocated-cadence's row at rate 16 with 6 requests done:\n%s", report)
	}
	if strings.Contains(report, "--max-num-batched-tokens     8: SLO met") {
		t.Errorf("one --mnbt-sweep value was tuned anyway:\n%s", report)
	}
	if strings.Contains(report, "FAILED") {
		t.Errorf("the report names failed requests:\n%s", report)
	}
	var sum experiment.PDSummary
	readJSON(t, filepath.Join(out, "summary.json"), &sum)
	if sum.MNBT != 8 || (sum.Interval != 2 && sum.Interval != 4) || len(sum.Workloads) != 1 || len(sum.Failed) != 0 {
		t.Fatalf("summary.json: mnbt %d, interval %d, %d workloads, failed %q; want 8, 2 or 4, 1, none", sum.MNBT, sum.Interval, len(sum.Workloads), sum.Failed)
	}
	ws := sum.Workloads[0]
	if c := ws.Cadence; c == nil || c.Interval != sum.Interval || c.Deferred <= 0 || c.Lifted < 0 {
		t.Errorf("cadence over the chat mix: %+v, want the chosen interval and steps deferred", c)
	}
	if len(ws.Capacity) != 2 || ws.Capacity[1].Target != "colocated-cadence" || len(ws.Grid) != 25 || len(ws.Grid[0].Capacities) != 2 {
		t.Errorf("capacities %+v and a grid of %d cells, want both configurations in each", ws.Capacity, len(ws.Grid))
	}
	// The tuning engines and the chosen one ran with their interval; the
	// plain colocated engine without one.
	for _, f := range []string{"colocated-mnbt8-interval2.log", "colocated-mnbt8-interval4.log", "colocated-mnbt8.log"} {
		if _, err := os.Stat(filepath.Join(out, "logs", f)); err != nil {
			t.Errorf("no log of an engine: %v", err)
		}
	}
}

// TestBenchExperimentIntervalSweepChecked: a bad --interval-sweep fails
// before anything starts, and colocated-cadence is a configuration the
// command knows.
func TestBenchExperimentIntervalSweepChecked(t *testing.T) {
	err := runBenchExperiment([]string{"pd", "--model", t.TempDir(), "--out", t.TempDir(), "--interval-sweep", "2,0"})
	if err == nil || !strings.Contains(err.Error(), "--interval-sweep: bad number") {
		t.Errorf("err = %v, want --interval-sweep's bad value named", err)
	}
	if !slices.Contains(experiment.Configurations(), "colocated-cadence") {
		t.Errorf("configurations %v lack colocated-cadence", experiment.Configurations())
	}
}

// TestBenchExperimentFailsWhenRequestsFail: a request timeout no request can
// meet makes every request fail, and the command must say so with an error
// (after writing the report), not exit 0.
func TestBenchExperimentFailsWhenRequestsFail(t *testing.T) {
	dir := testmodels.Stories260K(t)
	t.Setenv(actAsTandem, "1")
	out := t.TempDir()
	err := runBenchExperiment([]string{"pd", "--model", dir, "--out", out, "--configs", "colocated", "--workloads", "chat",
		"--chat-rates", "8", "--requests", "2", "--rounds", "1", "--mnbt-sweep", "256", "--max-context", "256", "--timeout", "1ns"})
	if err == nil || !strings.Contains(err.Error(), "requests failed: 2 of colocated's requests at rate 8 (chat)") {
		t.Errorf("err = %v, want the failed requests named", err)
	}
	b, rerr := os.ReadFile(filepath.Join(out, "report.txt"))
	if rerr != nil {
		t.Fatalf("no report after failures: %v", rerr)
	}
	if !strings.Contains(string(b), "FAILED requests") || !strings.Contains(string(b), "2 of colocated's requests at rate 8 (chat)") {
		t.Errorf("the report does not name the failures:\n%s", b)
	}
	var sum experiment.PDSummary
	readJSON(t, filepath.Join(out, "summary.json"), &sum)
	if len(sum.Failed) != 1 {
		t.Errorf("summary.json failed = %q, want the one failed level", sum.Failed)
	}
}

// TestBenchExperimentStopsWhenAnEngineCannotStart: an engine that exits
// at start (here: a model directory without a model) fails the experiment
// at once with the engine's last log line, rather than after the ten
// minutes a slow model may take to become healthy.
func TestBenchExperimentStopsWhenAnEngineCannotStart(t *testing.T) {
	t.Setenv(actAsTandem, "1")
	out := t.TempDir()
	start := time.Now()
	err := runBenchExperiment([]string{"pd", "--model", t.TempDir(), "--out", out, "--configs", "pd", "--workloads", "chat",
		"--requests", "1", "--rounds", "1", "--mnbt-sweep", "256"})
	// Both engines fail; whichever exits first is named.
	if err == nil || !regexp.MustCompile(`pd-(prefill|decode)-0 exited with status 1 during startup(.|\n)*pd-(prefill|decode)-0\.log`).MatchString(err.Error()) {
		t.Errorf("err = %v, want the engine's exit and its log named", err)
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("took %v to notice", d)
	}
}
