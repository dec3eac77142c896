package experiment

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// The colocated-cadence engine's counters, tandem serve's
// --prefill-schedule-interval at work.
const (
	metricStepsDeferred = "tandem:prefill_steps_deferred_total"
	metricCadenceLifted = "tandem:prefill_cadence_lifted_total"
)

// CadenceSteps counts, over one workload, the colocated-cadence engine's
// steps in which the cadence deferred prefill compute while requests
// decoded, and its off-cadence steps that ran prefill anyway because the
// waiting queue had not drained (the capacity-bound guard).
type CadenceSteps struct {
	Interval int     `json:"prefill_schedule_interval"`
	Deferred float64 `json:"steps_deferred"`
	Lifted   float64 `json:"steps_lifted_by_guard"`
}

// scrapeCadence reads the cadence counters from the /metrics page of the
// engine at url; ok is false when the page could not be read.
func scrapeCadence(ctx context.Context, url string) (c CadenceSteps, ok bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return c, false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return c, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, val, found := strings.Cut(sc.Text(), " ")
		if !found {
			continue
		}
		base, _, _ := strings.Cut(name, "{")
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		switch base {
		case metricStepsDeferred:
			c.Deferred += f
		case metricCadenceLifted:
			c.Lifted += f
		}
	}
	return c, sc.Err() == nil && resp.StatusCode == http.StatusOK
}

// cadenceDelta is the growth of the counters from before to after, at
// interval.
func cadenceDelta(before, after CadenceSteps, interval int) CadenceSteps {
	return CadenceSteps{Interval: interval, Deferred: after.Deferred - before.Deferred, Lifted: after.Lifted - before.Lifted}
}

// writeCadence prints the colocated-cadence engine's counters over a
// workload.
func writeCadence(w io.Writer, c CadenceSteps) {
	fmt.Fprintf(w, "colocated-cadence (--prefill-schedule-interval %d): %.0f steps deferred prefill while requests decoded, %.0f off-cadence steps ran it because requests still waited (capacity-bound guard)\n",
		c.Interval, c.Deferred, c.Lifted)
}
