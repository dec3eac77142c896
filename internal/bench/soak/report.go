package soak

import (
	"fmt"
	"io"
	"slices"
)

// Failures lists the invariants r breaks, each as a sentence; none means
// the soak passed. Errors during faults are expected and reported, not
// failures; hung requests, KV still held after the drain, memory growth
// beyond lim, a fault that could not be carried out and a run in which no
// request succeeded are.
func Failures(r *Result, lim RSSLimit) []string {
	var out []string
	if r.Hung > 0 {
		out = append(out, fmt.Sprintf("%d requests hung (no answer within the hard deadline %v)", r.Hung, r.Deadline))
	}
	if r.Tally.Total()-r.Tally.Failed() == 0 {
		out = append(out, "no request succeeded")
	}
	for _, d := range r.Drain {
		switch {
		case d.Err != "":
			out = append(out, fmt.Sprintf("%s: reading /metrics after the load: %s", d.Engine, d.Err))
		case d.Usage != 0 || d.Held != 0:
			out = append(out, fmt.Sprintf("%s still holds KV %v after the load stopped: %s %g, %s %g (a leaked block or lease)",
				d.Engine, d.After.Round(1e6), MetricKVUsage, d.Usage, MetricHeld, d.Held))
		}
	}
	for _, f := range r.Faults {
		if f.Err != "" {
			out = append(out, fmt.Sprintf("fault %q failed: %s", f.Fault.String(), f.Err))
		}
	}
	for _, l := range r.Lives {
		if msg := lim.Check(l); msg != "" {
			out = append(out, msg)
		}
	}
	return out
}

// Write prints the report: requests by outcome, the faults, the drain and
// the memory of every engine, then the verdict.
func Write(w io.Writer, r *Result, lim RSSLimit) []string {
	fmt.Fprintf(w, "requests: %d sent, %d answered OK, %d failed, %d hung (hard deadline %v); %v in all\n",
		r.Sent, r.Tally.Total()-r.Tally.Failed(), r.Tally.Failed(), r.Hung, r.Deadline, r.Elapsed.Round(1e6))
	kinds := make([]string, 0, len(r.Tally))
	for k := range r.Tally {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		fmt.Fprintf(w, "  %6d  %s\n", r.Tally[k], k)
	}
	fmt.Fprintf(w, "faults (%d):\n", len(r.Faults))
	for _, f := range r.Faults {
		status := fmt.Sprintf("back in %v", f.Took.Round(1e6))
		if f.Err != "" {
			status = "FAILED: " + f.Err
		}
		fmt.Fprintf(w, "  %s: %s\n", f.Fault.String(), status)
	}
	fmt.Fprintf(w, "KV after the load (must be 0):\n")
	for _, d := range r.Drain {
		held := fmt.Sprintf("%g", d.Held)
		if !d.HeldSeen {
			held = "not exported"
		}
		if d.Err != "" {
			fmt.Fprintf(w, "  %-10s error: %s\n", d.Engine, d.Err)
			continue
		}
		fmt.Fprintf(w, "  %-10s %s %g, %s %s (after %v)\n", d.Engine, MetricKVUsage, d.Usage, MetricHeld, held, d.After.Round(1e6))
	}
	fmt.Fprintf(w, "RSS per process life (MiB; growth = second half's peak over the first half's; allowed max(%.0f%%, %.0f MiB)):\n",
		100*lim.Fraction, mib(lim.Slack))
	for _, l := range r.Lives {
		first, last, peak := l.Stats()
		base, growth, ok := l.Growth()
		g := "n/a (few samples)"
		if ok {
			g = fmt.Sprintf("%+.1f over %.1f", mib(growth), mib(base))
		}
		fmt.Fprintf(w, "  %-10s pid %-7d %3d samples %6.1fs–%6.1fs  first %6.1f  last %6.1f  max %6.1f  growth %s\n",
			l.Engine, l.PID, len(l.Samples), l.Samples[0].At.Seconds(), l.Samples[len(l.Samples)-1].At.Seconds(),
			mib(first), mib(last), mib(peak), g)
	}
	fails := Failures(r, lim)
	if len(fails) == 0 {
		fmt.Fprintf(w, "PASS: no request hung, no KV held after the drain, no RSS growth beyond the tolerance\n")
	}
	for _, f := range fails {
		fmt.Fprintf(w, "FAIL: %s\n", f)
	}
	return fails
}
