package bench

import (
	"bytes"
	"context"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/bench/workload"
)

// TestSavedRunKeepsItsPrompts: a run saved as JSON (whose workload keeps
// its conversations out) says how many requests a level had, their mean
// lengths and a digest of the prompts; read back, its table says so, and
// two runs of the same workload and seed have no differences.
func TestSavedRunKeepsItsPrompts(t *testing.T) {
	srv := httptest.NewServer(&latencyServer{prefill: time.Millisecond, tpot: time.Millisecond})
	defer srv.Close()
	w := workload.MultiTurn(1, 4, workload.Fixed(3), workload.Fixed(8), workload.Fixed(4), workload.Fixed(5), testPool)
	p := &Plan{Targets: []Target{{"a", srv.URL}}, Model: "m", Workload: w, Loads: []Load{{Rate: 50}}, Rounds: 2,
		Timeout: 10 * time.Second, SLO: SLO{TTFT: time.Second, TPOT: time.Second}, Pool: testPool, Warmup: &Warmup{Requests: 3, Rate: 50}}
	s, err := Run(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteJSON(&buf, s); err != nil {
		t.Fatal(err)
	}
	back, err := ReadSuite(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if back.Plan.Workload.Requests() != 0 {
		t.Fatal("the saved workload kept its conversations: this test no longer tests a saved run")
	}
	want := DescribePrompts(w)
	if want.Requests != 12 || len(want.Digest) != 64 || !reflect.DeepEqual(back.Prompts, want) {
		t.Errorf("saved prompts %+v, want %+v with 12 requests", back.Prompts, want)
	}
	if *back.Plan.Warmup != (Warmup{Requests: 3, Rate: 50}) {
		t.Errorf("saved warm-up %+v", back.Plan.Warmup)
	}
	var tbl strings.Builder
	if err := WriteTable(&tbl, back); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tbl.String(), "workload multiturn: 12 requests, mean prompt 20 ") {
		t.Errorf("re-read table does not say the requests:\n%s", tbl.String())
	}
	// A run saved before runs recorded their prompts counts its requests
	// from the records.
	back.Prompts = nil
	tbl.Reset()
	if err := WriteTable(&tbl, back); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tbl.String(), "workload multiturn: 12 requests (counted from the records; ") || RequestsPerLevel(back) != 12 {
		t.Errorf("re-read table without the prompts:\n%s", tbl.String())
	}
	if got := PooledNote(back); got != "24 requests per target (2 rounds of 12)" {
		t.Errorf("PooledNote = %q", got)
	}
	if d := Differences(s, back); len(d) != 0 {
		t.Errorf("a run and its saved copy differ: %q", d)
	}
}

// TestDescribePromptsTellsWorkloadsApart: another seed or one token
// changed is another digest; the same workload built twice is the same.
func TestDescribePromptsTellsWorkloadsApart(t *testing.T) {
	a, b := workload.Chat(1, 6, testPool), workload.Chat(1, 6, testPool)
	if DescribePrompts(a).Digest != DescribePrompts(b).Digest {
		t.Error("the same workload twice has two digests")
	}
	if DescribePrompts(a).Digest == DescribePrompts(workload.Chat(2, 6, testPool)).Digest {
		t.Error("another seed has the same digest")
	}
	b.Conversations[5].Turns[0].Prompt[0]++
	if DescribePrompts(a).Digest == DescribePrompts(b).Digest {
		t.Error("a changed token has the same digest")
	}
	if DescribePrompts(&workload.Workload{}) != nil || DescribePrompts(nil) != nil {
		t.Error("an empty workload described")
	}
}

// TestDifferencesNameWhatDiffers: each field that makes runs one workload
// is named with both values; the first prompt level only in a note.
func TestDifferencesNameWhatDiffers(t *testing.T) {
	base := func() *Suite {
		s := gridSuite()
		s.Plan.Workload, s.Plan.Model, s.Plan.Seed, s.Plan.Rounds = &workload.Workload{Name: "chat"}, "m", 1, 2
		s.Plan.Loads = []Load{{Rate: 1}, {Rate: 2}}
		return s
	}
	if d := Differences(base(), base()); len(d) != 0 {
		t.Errorf("a run differs from itself: %q", d)
	}
	b := base()
	b.Plan.Seed, b.Plan.Rounds, b.Plan.Loads, b.Plan.Model = 2, 1, []Load{{Rate: 1}}, "n"
	got := strings.Join(Differences(base(), b), "; ")
	for _, want := range []string{"seed: 1 against 2", "rounds: 2 against 1", "loads: [rate 1 rate 2] against [rate 1]", "model: m against n",
		"requests per rate and round: 2 against 4"} {
		if !strings.Contains(got, want) {
			t.Errorf("differences %q lack %q", got, want)
		}
	}
	b = base()
	b.Plan.FirstLevel = 6
	if len(Differences(base(), b)) != 0 || !strings.Contains(LevelNote(base(), b), "from 0 against 6") || LevelNote(base(), base()) != "" {
		t.Errorf("first level: differences %q, note %q", Differences(base(), b), LevelNote(base(), b))
	}
}

// TestMergeSuitesJoinsTargets: two runs' targets become one suite's, in
// order; the same target with the same requests twice is kept once, with
// other requests refused.
func TestMergeSuitesJoinsTargets(t *testing.T) {
	split := func(target string) *Suite {
		s := gridSuite()
		var keep []*Result
		for _, r := range s.Results {
			if r.Target == target {
				keep = append(keep, r)
			}
		}
		s.Results = keep
		return s
	}
	m, err := MergeSuites([]*Suite{split("smooth"), split("fast-start"), split("smooth")})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Plan.Targets) != 2 || m.Plan.Targets[0].Name != "smooth" || m.Plan.Targets[1].Name != "fast-start" || len(m.Results) != 4 {
		t.Errorf("merged targets %+v, %d results", m.Plan.Targets, len(m.Results))
	}
	m.Rescore(m.Plan.SLO, 0)
	whole := gridSuite()
	whole.Rescore(whole.Plan.SLO, 0)
	if !reflect.DeepEqual(SLOGrid(m, GridScales, GridScales)[7].Best, SLOGrid(whole, GridScales, GridScales)[7].Best) {
		t.Error("the merged run's grid differs from the whole run's")
	}
	other := split("smooth")
	other.Results[0].Records = other.Results[0].Records[:3]
	if _, err := MergeSuites([]*Suite{split("smooth"), other}); err == nil || !strings.Contains(err.Error(), `"smooth" is in two runs with different requests`) {
		t.Errorf("err = %v, want the two smooth runs refused", err)
	}
}
