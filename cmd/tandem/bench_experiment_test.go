package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

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
// alternating rounds, and writes the report and plots.
func TestBenchExperimentPDEndToEnd(t *testing.T) {
	dir := testmodels.Stories260K(t)
	t.Setenv(actAsTandem, "1")
	out := t.TempDir()
	err := runBenchExperiment([]string{"pd", "--model", dir, "--out", out, "--requests", "3", "--rounds", "2",
		"--chat-rates", "6", "--long-rates", "4,8", "--mnbt-sweep", "32,256", "--tune-requests", "2", "--max-context", "256"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "report.txt"))
	if err != nil {
		t.Fatal(err)
	}
	report := string(b)
	for _, want := range []string{"chosen:", "== workload chat", "== workload long", "colocated  rate 4", "remote 6", "P/D time breakdown",
		"P:D ratio model", "conditional disaggregation (the router's): not measured"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	if strings.Contains(report, "fail") && !strings.Contains(report, "fail  req/s") {
		t.Errorf("report mentions failures:\n%s", report)
	}
	for _, f := range []string{"results-chat.json", "results-long.json", "long-vs-rate.png", "long-vs-rate.svg", "chat-latency-cdf.png", "long-itl-over-time.svg"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s missing or empty: %v", f, err)
		}
	}
}

func TestBenchExperimentConditionalIsAHookNotAFake(t *testing.T) {
	dir := testmodels.Stories260K(t)
	t.Setenv(actAsTandem, "1")
	err := runBenchExperiment([]string{"pd", "--model", dir, "--out", t.TempDir(), "--configs", "conditional", "--mnbt-sweep", "256"})
	if err == nil || !strings.Contains(err.Error(), "not built yet") {
		t.Errorf("err = %v, want the conditional hook to say the router is not built", err)
	}
}
