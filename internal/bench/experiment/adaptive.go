package experiment

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-serve/tandem/internal/launch"
)

// Adaptive is the configuration of the P/D experiment that decides for
// itself: the pd configuration's engines, each serving both roles (tandem
// serve --role both), behind a proxy with the router's defaults (--policy
// prefix; the decider the command passes in PD.AdaptiveArgs, tandem bench
// experiment --adaptive-decider, else conditional) and the planner acting
// on the workload's objectives (--slo-ttft, --slo-tpot, --planner-act), as
// `tandem up` with the SLO flags runs them. It is started afresh for each
// workload, so the planner learns each from nothing.
const Adaptive = "adaptive"

// adaptiveProxyArgs are the adaptive configuration's proxy flags for a
// workload wl (its objectives), before PD.AdaptiveArgs.
func (r *pdRun) adaptiveProxyArgs(wl Workload) []string {
	args := []string{"--policy", "prefix", "--pd-decider", "conditional", "--pd-threshold", strconv.Itoa(r.cfg.Threshold),
		"--model", r.model, "--slo-ttft", wl.SLO.TTFT.String(), "--slo-tpot", wl.SLO.TPOT.String(), "--planner-act",
		"--plan-max-num-seqs", strconv.Itoa(r.maxNumSeqs())}
	if r.goal < 1 { // the planner's goal is a fraction below 1
		args = append(args, "--slo-goal", strconv.FormatFloat(r.goal, 'g', -1, 64))
	}
	return append(args, r.cfg.AdaptiveArgs...)
}

// startAdaptive starts the adaptive configuration for workload wl: one
// prefill and one decode engine, both --role both and with the tuned chunk
// budget, behind a proxy whose planner has wl's objectives.
func (r *pdRun) startAdaptive(ctx context.Context, wl Workload, t tuned) (*cluster, error) {
	return r.startClusterWith(ctx, r.model, filepath.Base(r.model), clusterOpts{name: Adaptive + "-" + wl.Name, prefill: 1, decode: 1,
		role: launch.RoleBoth, engineArgs: mnbtFlags(t.mnbt), proxyArgs: r.adaptiveProxyArgs(wl)})
}

// PlannerState is where the adaptive configuration's planner stood at the
// end of a workload, from the proxy's tandem:planner_* metrics.
type PlannerState struct {
	// Prefill and Decode are the split it wants.
	Prefill int `json:"desired_prefill"`
	Decode  int `json:"desired_decode"`
	// Threshold is the conditional decider's threshold it chose.
	Threshold int `json:"threshold_tokens"`
	// Interval is the prefill cadence it advises.
	Interval int `json:"prefill_schedule_interval"`
	// Goodput is the requests/s its model predicts for the split.
	Goodput float64 `json:"predicted_goodput_rps"`
	// Decisions counts its decisions by result (changed, held, steady).
	Decisions map[string]int `json:"decisions"`
	// Switches counts the engines it moved, by the role they took.
	Switches map[string]int `json:"role_switches,omitempty"`
}

// scrapePlanner reads the planner's metrics from the proxy at url; false
// when the page could not be read or has none.
func scrapePlanner(ctx context.Context, url string) (PlannerState, bool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return PlannerState{}, false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return PlannerState{}, false
	}
	defer resp.Body.Close()
	return parsePlanner(resp.Body)
}

// parsePlanner reads the tandem:planner_* samples of a Prometheus text
// page; false when it has none.
func parsePlanner(page io.Reader) (PlannerState, bool) {
	p := PlannerState{Decisions: map[string]int{}, Switches: map[string]int{}}
	found := false
	sc := bufio.NewScanner(page)
	for sc.Scan() {
		line := sc.Text()
		name, val, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(name, "tandem:planner_") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		base, labels, _ := strings.Cut(name, "{")
		label := ""
		if _, rest, ok := strings.Cut(labels, `="`); ok {
			label, _, _ = strings.Cut(rest, `"`)
		}
		found = true
		switch base {
		case "tandem:planner_desired_replicas":
			if label == "prefill" {
				p.Prefill = int(v)
			} else {
				p.Decode = int(v)
			}
		case "tandem:planner_threshold_tokens":
			p.Threshold = int(v)
		case "tandem:planner_prefill_schedule_interval":
			p.Interval = int(v)
		case "tandem:planner_predicted_goodput_rps":
			p.Goodput = v
		case "tandem:planner_decisions_total":
			p.Decisions[label] = int(v)
		case "tandem:planner_role_switches_total":
			p.Switches[label] = int(v)
		}
	}
	return p, found
}

// writePlanner prints where the adaptive configuration's planner stood.
func writePlanner(w io.Writer, p PlannerState) {
	fmt.Fprintf(w, "adaptive: the planner at the end: %dP:%dD, threshold %d tokens, prefill cadence %d, predicted goodput %.3g req/s; decisions: %d changed, %d held, %d steady; engines moved: %d to prefill, %d to decode\n",
		p.Prefill, p.Decode, p.Threshold, p.Interval, p.Goodput, p.Decisions["changed"], p.Decisions["held"], p.Decisions["steady"],
		p.Switches["prefill"], p.Switches["decode"])
}
