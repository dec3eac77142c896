package planner

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestIdleEngineKeepsItsLastFit: after a burst the engines idle (scraped,
// nothing running, no inter-token latency to measure) for longer than
// MaxAge; the next decision fits their last busy points and decides. The
// same silence from engines that are busy is stale: the decision holds.
func TestIdleEngineKeepsItsLastFit(t *testing.T) {
	for _, c := range []struct {
		name  string
		idle  bool
		stale bool
	}{
		{"idle engines keep their last fit", true, false},
		{"busy engines without fresh samples are stale", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			pl := newPlanner(t, Config{Engines: 4, Prefill: 2, MaxAge: 5 * time.Second})
			end := feed(pl, t0, 20*time.Second, longPrompt, 4, 2)
			// 30 s without a decoded token: scraped, prefill costs known.
			for at := end; at.Before(end.Add(30 * time.Second)); at = at.Add(time.Second) {
				for i := range 4 {
					s := EngineSample{At: at, URL: fmt.Sprintf("http://e%d", i), PrefillSecondsPerToken: prefillCost, Decode: i >= 2, Idle: c.idle}
					pl.ObserveEngine(s)
				}
			}
			d := pl.Decide(end.Add(30 * time.Second))
			if stale := strings.Contains(d.Held, "stale"); stale != c.stale {
				t.Fatalf("held %q (idle points %d), want stale: %v", d.Held, d.Fit.IdlePoints, c.stale)
			}
			if !c.stale && (d.Fit.DecodeFit != "fit" || d.Fit.IdlePoints == 0) {
				t.Fatalf("decode fit %q from %d idle points, want the engines' last points fitted", d.Fit.DecodeFit, d.Fit.IdlePoints)
			}
		})
	}
}
