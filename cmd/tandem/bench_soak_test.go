package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/testmodels"
)

// TestBenchSoakShortForm is the soak's short form in CI: 2 prefill + 2
// decode engines and a proxy as processes on stories260K, 12 s of Poisson
// load with a kill -9/restart of a prefill engine at 4 s and a
// SIGSTOP/SIGCONT of a decode engine at 8 s. runBenchSoak returns an error
// when an invariant fails (a hung request, KV held after the drain, RSS
// growth), so passing it is the assertion; the report is checked too.
func TestBenchSoakShortForm(t *testing.T) {
	dir := testmodels.Stories260K(t)
	t.Setenv(actAsTandem, "1")
	out := t.TempDir()
	stdout, stderr, err := captureOutput(t, func() error {
		return runBenchSoak([]string{"--model", dir, "--out", out, "--duration", "12s", "--fault-every", "4s",
			"--stall", "2s", "--kv-lease", "2s", "--rate", "6", "--concurrency", "8", "--deadline", "20s",
			"--rss-every", "500ms", "--drain-timeout", "15s"})
	})
	b, rerr := os.ReadFile(filepath.Join(out, "report.txt"))
	if err != nil {
		t.Fatalf("soak failed: %v\n%s\nstderr:\n%s", err, b, stderr)
	}
	checkPlain(t, stdout, stderr, `(?m)^soak load: \d+ answered(, \d+ failed)? in 1\ds$`)
	if rerr != nil {
		t.Fatal(rerr)
	}
	report := string(b)
	for _, want := range []string{"kill -9 + restart prefill-0: back in", "SIGSTOP/SIGCONT decode-0 for 2s: back in",
		"0 hung", "decode-1   vllm:kv_cache_usage_perc 0, tandem:kv_blocks_held 0", "prefill-0  pid", "proxy      pid", "PASS:"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	// The killed engine's two lives are sampled separately.
	if n := strings.Count(report, "prefill-0  pid"); n != 2 {
		t.Errorf("prefill-0 has %d process lives in the report, want 2 (before and after the kill):\n%s", n, report)
	}
	if _, err := os.Stat(filepath.Join(out, "logs", "prefill-0.1.log")); err != nil {
		t.Errorf("the restarted engine's log: %v", err)
	}
}

func TestBenchSoakRejectsNoLoad(t *testing.T) {
	err := runBenchSoak([]string{"--rate", "0", "--concurrency", "0"})
	if err == nil || !strings.Contains(err.Error(), "--rate or --concurrency") {
		t.Errorf("err = %v, want the load flags named", err)
	}
}
