package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/promtest"
	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/router/kvindex"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// TestPrometheusScrapesAndEvaluatesTheRules runs a real Prometheus against
// a proxy and two simulated engines (real TCP, in process), with
// deploy/observability/rules.yml loaded (its group intervals cut to the
// test's 1 s), while P/D requests flow: every target is up, every rule
// evaluates without error, the recording rules produce series (the proxy's
// stage quantiles, the TTFT SLO's error ratios, the router's KV-event
// lag), every alert's expression answers a query, the alert on an
// ejected backend (a prefill nobody listens on) goes pending, and the
// KV-events alert stays quiet while the router keeps up.
func TestPrometheusScrapesAndEvaluatesTheRules(t *testing.T) {
	if _, err := promtest.Binary(); err != nil {
		testutil.Missing(t, err.Error())
	}
	pub, replay := testutil.FreePort(t), testutil.FreePort(t)
	pre, _ := startSimEngine(t, "--role", "prefill", "--kv-port", "0")
	dec, _ := startSimEngine(t, "--role", "decode", "--kv-events-config",
		fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":"tcp://*:%d","replay_endpoint":"tcp://*:%d"}`, pub, replay))
	dead := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))
	p, pu := startTestProxy(t, proxy.Config{Prefill: []string{pre, dead}, Decode: []string{dec}, PDDecider: "always", PrefillRetries: 1})
	// The router follows the decode's KV events, as --kv-events makes it.
	idx := kvindex.New("tandem-test", 16, slog.New(slog.DiscardHandler))
	t.Cleanup(idx.Close)
	decBase, err := proxy.NormalizeBackendURL(dec)
	if err != nil {
		t.Fatal(err)
	}
	if err := idx.Follow(decBase, fmt.Sprintf("tcp://127.0.0.1:%d", pub), fmt.Sprintf("tcp://127.0.0.1:%d", replay), ""); err != nil {
		t.Fatal(err)
	}
	p.MetricsRegisterer().MustRegister(idx.Collector())
	waitHealthy(t, pu)

	rules, err := os.ReadFile("../../deploy/observability/rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	fast := strings.ReplaceAll(string(rules), "interval: 30s", "interval: 1s")
	if fast == string(rules) {
		t.Fatal("rules.yml has no group interval of 30s to shorten; update the test")
	}
	rulePath := filepath.Join(t.TempDir(), "rules.yml")
	if err := os.WriteFile(rulePath, []byte(fast), 0o644); err != nil {
		t.Fatal(err)
	}
	prom := promtest.Start(t, promtest.Config{
		Targets: map[string][]string{
			"tandem-proxy":  {hostPort(t, pu)},
			"tandem-engine": {hostPort(t, pre), hostPort(t, dec)},
		},
		RuleFiles: []string{rulePath},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Each recording rule and the series it must produce, and the raw
	// series an alert reads that only Tandem's code exports.
	wantSeries := map[string]string{
		`stage:tandem_proxy_stage_seconds:p99_5m{stage="route"}`:                            "the route stage's p99",
		`stage:tandem_proxy_stage_seconds:p50_5m{stage="decode_first_byte"}`:                "the decode's first byte's p50",
		`tandem:ttft_slo_errors:ratio_rate5m`:                                               "the TTFT SLO's 5m error ratio",
		`tandem:ttft_slo_errors:ratio_rate1h`:                                               "the TTFT SLO's 1h error ratio",
		fmt.Sprintf(`instance:tandem_kv_events_lag:batches{instance=%q}`, hostPort(t, dec)): "the router's KV-event lag behind the decode",
		// Raw series the alerts read, from the engine that exports them.
		fmt.Sprintf(`tandem:kv_holds_by_age{instance=%q,kind="decode_leg",older_than="300s"}`, hostPort(t, pre)): "the prefill's holds by age",
	}
	var last string
	testutil.WaitFor(t, "Prometheus to scrape, evaluate every rule and record every series", 90*time.Second, func() bool {
		// Keep requests flowing so that rates have something to rate.
		if status, pd, body := completion(t, pu, pdBody(""), nil); status != http.StatusOK {
			t.Fatalf("request through the proxy: %d %s %s", status, pd, body)
		}
		if last = notReady(ctx, prom, wantSeries); last != "" {
			return false
		}
		return true
	})
	if last != "" {
		t.Fatal(last)
	}

	targets, err := prom.Targets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(targets) != 3 {
		t.Errorf("%d scrape targets, want 3: %+v", len(targets), targets)
	}
	for _, tg := range targets {
		if tg.Health != "up" {
			t.Errorf("target %s is %s: %s", tg.ScrapeURL, tg.Health, tg.Error)
		}
	}
	all, err := prom.Rules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	alerts := 0
	for _, r := range all {
		if r.Health != "ok" {
			t.Errorf("rule %s (%s): health %s %s", r.Name, r.Group, r.Health, r.Error)
		}
		if r.Type != "alerting" {
			continue
		}
		alerts++
		// The expression answers a query of its own (empty is an answer:
		// nothing is wrong).
		if _, err := prom.Query(ctx, r.Query); err != nil {
			t.Errorf("alert %s: %v", r.Name, err)
		}
	}
	if alerts < 5 {
		t.Errorf("%d alerts loaded, want every alert of rules.yml", alerts)
	}
}

// notReady says what Prometheus has not done yet ("" when it has): a
// target not scraped up, a rule not evaluated, a series not recorded, or
// the ejected prefill's alert not pending, or the KV-event alert pending
// though the router keeps up with the decode.
func notReady(ctx context.Context, prom *promtest.Server, wantSeries map[string]string) string {
	targets, err := prom.Targets(ctx)
	if err != nil {
		return err.Error()
	}
	for _, tg := range targets {
		if tg.Health != "up" {
			return fmt.Sprintf("target %s is %s %s", tg.ScrapeURL, tg.Health, tg.Error)
		}
	}
	rules, err := prom.Rules(ctx)
	if err != nil {
		return err.Error()
	}
	ejected := false
	for _, r := range rules {
		if r.Health != "ok" {
			return fmt.Sprintf("rule %s: health %s %s", r.Name, r.Health, r.Error)
		}
		if r.Name == "TandemKVEventsLagging" && len(r.Alerts) > 0 {
			return fmt.Sprintf("TandemKVEventsLagging is %s for %v, a router that keeps up", r.Alerts[0].State, r.Alerts[0].Labels)
		}
		if r.Name == "TandemBackendEjected" {
			for _, a := range r.Alerts {
				if a.Labels["role"] == "prefill" && (a.State == "pending" || a.State == "firing") {
					ejected = true
				}
			}
		}
	}
	for expr, what := range wantSeries {
		s, err := prom.Query(ctx, expr)
		if err != nil {
			return err.Error()
		}
		if len(s) == 0 {
			return fmt.Sprintf("no series for %s (%s)", expr, what)
		}
	}
	if !ejected {
		return "TandemBackendEjected is not pending for the prefill nobody listens on"
	}
	return ""
}

// hostPort is rawURL's host:port.
func hostPort(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		t.Fatalf("not a URL: %q", rawURL)
	}
	return u.Host
}
