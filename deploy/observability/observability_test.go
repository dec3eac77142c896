// Package observability holds the Prometheus rules and the Grafana
// dashboard for Tandem, and their tests: every query names only metrics
// Tandem exports, and the rules pass Prometheus's own promtool (check and
// unit tests).
package observability

import (
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/testutil"
	"go.yaml.in/yaml/v3"
)

// metricRef matches a Tandem or vLLM metric name in a query.
var metricRef = regexp.MustCompile(`\b(?:tandem|vllm):[a-z_]+`)

// exportedName matches a metric name as a string literal in Go source.
var exportedName = regexp.MustCompile(`"((?:tandem|vllm):[a-z_]+)"`)

// prefixName matches a metric name prefix that Go source completes with a
// helper's argument ("tandem:kv_events_" + name), and snakeLiteral the
// string literals that may complete it.
var (
	prefixName   = regexp.MustCompile(`"((?:tandem|vllm):[a-z_]+_)" \+ [a-z]`)
	snakeLiteral = regexp.MustCompile(`"([a-z][a-z_]*[a-z])"`)
)

// exported returns the metric names Tandem's Go source defines (non-test
// files under internal/ and cmd/). A file that builds names from a prefix
// counts the prefix joined to each snake_case string literal in the file.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for _, dir := range []string{"../../internal", "../../cmd"} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range exportedName.FindAllStringSubmatch(string(src), -1) {
				names[m[1]] = true
			}
			for _, p := range prefixName.FindAllStringSubmatch(string(src), -1) {
				for _, m := range snakeLiteral.FindAllStringSubmatch(string(src), -1) {
					names[p[1]+m[1]] = true
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(names) < 20 {
		t.Fatalf("found only %d metric names in the source; is the walk's root right?", len(names))
	}
	return names
}

// checkRefs fails the test for each metric expr names that Tandem does not
// export (a histogram's _bucket, _sum and _count series count as its own).
func checkRefs(t *testing.T, where, expr string, names map[string]bool) {
	t.Helper()
	for _, ref := range metricRef.FindAllString(expr, -1) {
		base := ref
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(ref, suf); ok && names[b] {
				base = b
			}
		}
		if !names[base] {
			t.Errorf("%s: %s is not a metric Tandem exports (expr %s)", where, ref, expr)
		}
	}
}

type ruleFile struct {
	Groups []struct {
		Name  string
		Rules []struct {
			Record, Alert, Expr string
		}
	}
}

func TestQueriesNameExportedMetrics(t *testing.T) {
	names := exported(t)
	data, err := os.ReadFile("rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules ruleFile
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatalf("rules.yml: %v", err)
	}
	// A rule may read a series another rule records.
	var recorded []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded = append(recorded, r.Record)
			}
		}
	}
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			expr := r.Expr
			for _, rec := range recorded {
				expr = strings.ReplaceAll(expr, rec, "")
			}
			checkRefs(t, "rules.yml "+r.Record+r.Alert, expr, names)
			n++
		}
	}
	if n == 0 {
		t.Fatal("rules.yml has no rules")
	}

	data, err = os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if len(dash.Panels) == 0 {
		t.Fatal("the dashboard has no panels")
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			checkRefs(t, "dashboard panel "+p.Title, q.Expr, names)
		}
	}
}

// promtool returns the promtool to run: $TANDEM_PROMTOOL, else one on
// PATH (Debian's prometheus package, or scripts/promtool-binary.sh's). It
// skips the test when there is none, unless TANDEM_REQUIRE_TESTDATA=1
// (CI), where it fails.
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TANDEM_PROMTOOL"); p != "" {
		return p
	}
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	msg := "no promtool: set TANDEM_PROMTOOL (bash scripts/promtool-binary.sh builds one) or install Prometheus's promtool on PATH"
	testutil.Missing(t, msg)
	return ""
}

func TestPromtoolChecksAndTestsRules(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{{"check", "rules", "rules.yml"}, {"test", "rules", "rules_test.yml"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
