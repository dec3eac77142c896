package proxy

import (
	"strings"
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
	// The mover starts late: the test decides when the engines switch.
	p, _ := startActingPlanner(t, engines[:1], engines[1:])

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

	startMover(t, p)
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
