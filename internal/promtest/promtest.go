package promtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// Config says what the server scrapes and evaluates.
type Config struct {
	// Targets are the scrape jobs: job name → host:port targets, scraped
	// at /metrics over HTTP.
	Targets map[string][]string
	// RuleFiles are rule files to load, as given to rule_files.
	RuleFiles []string
	// Interval is the scrape and rule evaluation interval (default 1s).
	Interval time.Duration
}

// Server is a running Prometheus.
type Server struct {
	// URL is its HTTP API's base, http://127.0.0.1:<port>.
	URL string
	// Log is the file its output goes to, for a failing test's message.
	Log string
}

// Binary returns the prometheus binary to run: $TANDEM_PROMETHEUS, else
// prometheus on PATH.
func Binary() (string, error) {
	if p := os.Getenv("TANDEM_PROMETHEUS"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("prometheus")
	if err != nil {
		return "", fmt.Errorf("promtest: no prometheus on PATH and TANDEM_PROMETHEUS unset: install Prometheus (apt-get install prometheus) or set TANDEM_PROMETHEUS to its binary")
	}
	return p, nil
}

// Start runs a Prometheus on a free loopback port with cfg, waits until it
// is ready, and stops it when the test ends. Without a binary it skips the
// test, or fails it under TANDEM_REQUIRE_TESTDATA.
func Start(t testing.TB, cfg Config) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		testutil.Missing(t, err.Error())
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(conf, configYAML(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ports, err := testutil.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	logPath := filepath.Join(dir, "prometheus.log")
	cmd := exec.Command(bin,
		"--config.file="+conf,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
	)
	exited := testutil.StartLogged(t, cmd, logPath)
	s := &Server{URL: "http://" + addr, Log: logPath}
	testutil.WaitStarted(t, "promtest: prometheus", exited, logPath, 60*time.Second, s.ready)
	return s
}

// ready reports whether the server answers /-/ready.
func (s *Server) ready() bool {
	resp, err := http.Get(s.URL + "/-/ready")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// configYAML renders prometheus.yml (JSON is YAML).
func configYAML(cfg Config) []byte {
	iv := cfg.Interval.String()
	type static struct {
		Targets []string `json:"targets"`
	}
	type job struct {
		Name          string   `json:"job_name"`
		StaticConfigs []static `json:"static_configs"`
	}
	jobs := make([]job, 0, len(cfg.Targets))
	for name, targets := range cfg.Targets {
		jobs = append(jobs, job{Name: name, StaticConfigs: []static{{Targets: targets}}})
	}
	sort.Slice(jobs, func(i, j int) bool { return jobs[i].Name < jobs[j].Name })
	doc := map[string]any{
		"global": map[string]string{
			"scrape_interval":     iv,
			"scrape_timeout":      iv,
			"evaluation_interval": iv,
		},
		"rule_files":     cfg.RuleFiles,
		"scrape_configs": jobs,
	}
	out, _ := json.MarshalIndent(doc, "", "  ")
	return out
}

// Sample is one series of a query's answer.
type Sample struct {
	Metric map[string]string
	Value  string // as Prometheus writes it: "0.25", "NaN", "+Inf"
}

// Query evaluates expr at the server's now (an instant query) and returns
// its samples.
func (s *Server) Query(ctx context.Context, expr string) ([]Sample, error) {
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := s.get(ctx, "/api/v1/query?query="+url.QueryEscape(expr), &data); err != nil {
		return nil, fmt.Errorf("query %s: %w", expr, err)
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("query %s: a %s, want a vector", expr, data.ResultType)
	}
	out := make([]Sample, len(data.Result))
	for i, r := range data.Result {
		v, _ := r.Value[1].(string)
		out[i] = Sample{Metric: r.Metric, Value: v}
	}
	return out, nil
}

// Rule is one rule's state as /api/v1/rules reports it.
type Rule struct {
	Group  string
	Name   string `json:"name"`
	Query  string `json:"query"`
	Type   string `json:"type"`   // "recording" or "alerting"
	Health string `json:"health"` // "ok", "err" or "unknown" (not evaluated yet)
	Error  string `json:"lastError"`
	State  string `json:"state"` // an alert's: "inactive", "pending" or "firing"
	Alerts []struct {
		Labels map[string]string `json:"labels"`
		State  string            `json:"state"`
	} `json:"alerts"`
}

// Rules returns every loaded rule's state.
func (s *Server) Rules(ctx context.Context) ([]Rule, error) {
	var data struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []Rule `json:"rules"`
		} `json:"groups"`
	}
	if err := s.get(ctx, "/api/v1/rules", &data); err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	var out []Rule
	for _, g := range data.Groups {
		for _, r := range g.Rules {
			r.Group = g.Name
			out = append(out, r)
		}
	}
	return out, nil
}

// Target is one scrape target's state as /api/v1/targets reports it.
type Target struct {
	Labels    map[string]string `json:"labels"`
	ScrapeURL string            `json:"scrapeUrl"`
	Health    string            `json:"health"` // "up", "down" or "unknown"
	Error     string            `json:"lastError"`
}

// Targets returns the active scrape targets.
func (s *Server) Targets(ctx context.Context) ([]Target, error) {
	var data struct {
		Active []Target `json:"activeTargets"`
	}
	if err := s.get(ctx, "/api/v1/targets?state=active", &data); err != nil {
		return nil, fmt.Errorf("targets: %w", err)
	}
	return data.Active, nil
}

// get reads an API answer's data into out.
func (s *Server) get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("%s: %s: %w", resp.Status, bytes.TrimSpace(body), err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(env.Error))
	}
	return json.Unmarshal(env.Data, out)
}
