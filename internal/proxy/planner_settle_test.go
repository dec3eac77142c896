package proxy

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// TestPlannerWaitsForTheMoveToTakeEffect: acting, the planner does not
// move the split again until the mover says the engines of its last
// change switched pools, and then until the requests routed since are
// most of its window; /tandem/plan's decision says which.
func TestPlannerWaitsForTheMoveToTakeEffect(t *testing.T) {
	engines := []*fakeEngine{newFake(t, bothRoles), newFake(t, bothRoles), newFake(t, bothRoles)}
	cfg := plannerConfig()
	cfg.TPOT, cfg.MinDwell, cfg.Window, cfg.Hysteresis = 40*time.Millisecond, time.Nanosecond, 10*time.Second, 0.01
	// The plan ticker never fires and the mover starts late: the test
	// decides at its own times.
	p, _ := startProxy(t, Config{PDDecider: "conditional", Planner: cfg, PlannerAct: true, PlanInterval: time.Hour}, engines[:1], engines[1:])
	scrapeAll(p)

	now := p.now()
	observeWindow(p, now, 64, 256)
	if d := p.planOnce(now); !d.Changed || d.Prefill != 0 {
		t.Fatalf("chat-like traffic: decision %dP:%dD (held %q), want the move to the colocated split", d.Prefill, d.Decode, d.Held)
	}
	// Long prompts: the best has a prefill pool again, but the engine has
	// not left it yet (no mover).
	later := now.Add(5 * time.Second)
	observeWindow(p, later, 3000, 8)
	d := p.planOnce(later)
	if d.Changed || d.Prefill != 0 || !strings.Contains(d.Held, "have not switched pools") {
		t.Fatalf("before the engines switched: decision %dP:%dD (best %+v, held %q), want 0P:3D held until they have", d.Prefill, d.Decode, d.Best, d.Held)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { p.moveEngines(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	testutil.WaitFor(t, "the prefill pool emptied", 5*time.Second, func() bool {
		return len(p.prefill.list()) == 0 && p.plan.moving.Load() == nil
	})
	// Switched just now: the window's requests were routed before.
	d = p.planOnce(later)
	if d.Changed || !strings.Contains(d.Held, "requests measured on it") || d.Settling != d.Held {
		t.Fatalf("just after the engines switched: decision %dP:%dD (held %q, settling %q), want held for the requests since", d.Prefill, d.Decode, d.Held, d.Settling)
	}
	// A window of requests since the switch: the split moves.
	last := later.Add(20 * time.Second)
	observeWindow(p, last, 3000, 8)
	if d = p.planOnce(last); !d.Changed || d.Prefill < 1 || d.Settling != "" {
		t.Fatalf("a window after the switch: decision %dP:%dD (held %q, settling %q), want a prefill engine back", d.Prefill, d.Decode, d.Held, d.Settling)
	}
}
