package experiment

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestScrapeCadence reads the cadence counters, labelled and summed, from a
// /metrics page, and the report line gives their growth over a workload.
func TestScrapeCadence(t *testing.T) {
	deferred, lifted := 3, 1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "# HELP %s steps\n# TYPE %s counter\n", metricStepsDeferred, metricStepsDeferred)
		fmt.Fprintf(w, "%s{model_name=\"m\"} %d\n%s{model_name=\"m\"} %d\n", metricStepsDeferred, deferred, metricCadenceLifted, lifted)
		fmt.Fprintf(w, "tandem:prefill_steps_deferred_total_other 99\nvllm:num_requests_running{model_name=\"m\"} 4\n")
	}))
	defer srv.Close()
	before, ok := scrapeCadence(context.Background(), srv.URL)
	if !ok || before.Deferred != 3 || before.Lifted != 1 {
		t.Fatalf("before: %+v, %v; want 3 deferred, 1 lifted", before, ok)
	}
	deferred, lifted = 10, 2
	after, ok := scrapeCadence(context.Background(), srv.URL)
	if !ok {
		t.Fatal("second scrape failed")
	}
	d := cadenceDelta(before, after, 4)
	if d != (CadenceSteps{Interval: 4, Deferred: 7, Lifted: 1}) {
		t.Errorf("delta %+v, want interval 4, 7 deferred, 1 lifted", d)
	}
	var b bytes.Buffer
	writeCadence(&b, d)
	if !strings.Contains(b.String(), "--prefill-schedule-interval 4): 7 steps deferred") || !strings.Contains(b.String(), "1 off-cadence steps ran it") {
		t.Errorf("report line: %s", b.String())
	}
	if _, ok := scrapeCadence(context.Background(), srv.URL+"/nowhere"); ok {
		t.Error("a page that answers 404 read as counters")
	}
}
