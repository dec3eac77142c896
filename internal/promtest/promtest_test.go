package promtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// TestStartScrapesAndEvaluates starts Prometheus with a target nobody
// listens on and a recording rule over its up series, and reads the rule's
// series, its state and the target back through the API.
func TestStartScrapesAndEvaluates(t *testing.T) {
	rules := filepath.Join(t.TempDir(), "rules.yml")
	if err := os.WriteFile(rules, []byte(`groups:
  - name: test
    rules:
      - record: job:up:sum
        expr: sum by (job) (up)
`), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := Start(t, Config{Targets: map[string][]string{"self": {"127.0.0.1:1"}}, RuleFiles: []string{rules}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []Sample
	testutil.WaitFor(t, "the recording rule's series", 30*time.Second, func() bool {
		var err error
		if got, err = srv.Query(ctx, `job:up:sum{job="self"}`); err != nil {
			t.Fatal(err)
		}
		return len(got) == 1
	})
	if got[0].Value != "0" {
		t.Errorf("job:up:sum = %s, want 0 (nothing listens on port 1)", got[0].Value)
	}
	rs, err := srv.Rules(ctx)
	if err != nil || len(rs) != 1 || rs[0].Name != "job:up:sum" || rs[0].Health != "ok" || rs[0].Group != "test" {
		t.Errorf("rules %+v, %v; want job:up:sum in group test, healthy", rs, err)
	}
	ts, err := srv.Targets(ctx)
	if err != nil || len(ts) != 1 || ts[0].Labels["job"] != "self" {
		t.Errorf("targets %+v, %v; want the one of job self", ts, err)
	}
	if _, err := srv.Query(ctx, "sum("); err == nil {
		t.Error("a query that does not parse answered no error")
	}
}
