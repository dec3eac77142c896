package kubediscovery

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// These tests run against a real kube-apiserver (package kubetest); the
// slices they write carry 198.18.0.0/15 addresses that nothing dials.

func TestWatcherFollowsASlice(t *testing.T) {
	k := newKube(t)
	rec := newRecorder()
	reg := prometheus.NewRegistry()
	var updates []Update
	upd := make(chan Update, 100)
	s := k.create(t, slice("decode-a", "decode", nil, ready("198.18.0.1"), ready("198.18.0.2")))
	w, _, _ := k.run(t, Config{
		Pools:      []Pool{{Role: RoleDecode, Selector: ServiceSelector("decode")}},
		Backends:   rec,
		Registerer: reg,
		OnUpdate:   func(u Update) { upd <- u },
	})
	rec.wait(t, RoleDecode, urls("198.18.0.1", "198.18.0.2")...)
	if u := <-upd; !u.Initial || u.Err != nil {
		t.Errorf("first update %+v, want the initial one", u)
	}
	testutil.WaitFor(t, "the watcher to be synced", waitLimit, w.Synced)
	if got, ok := w.Applied(RoleDecode); !ok || diffSets(urls("198.18.0.1", "198.18.0.2"), got) != "" {
		t.Errorf("Applied = %v %v", got, ok)
	}

	steps := []struct {
		name  string
		addrs []addr
		want  []string
	}{
		{"a pod comes", []addr{ready("198.18.0.1"), ready("198.18.0.2"), ready("198.18.0.3")}, urls("198.18.0.1", "198.18.0.2", "198.18.0.3")},
		{"a pod turns unready", []addr{ready("198.18.0.1"), unready("198.18.0.2"), ready("198.18.0.3")}, urls("198.18.0.1", "198.18.0.3")},
		{"a pod is terminating (still ready)", []addr{ready("198.18.0.1"), unready("198.18.0.2"), terminating("198.18.0.3")}, urls("198.18.0.1")},
		{"the unready pod is ready again", []addr{ready("198.18.0.1"), {ip: "198.18.0.2", ready: nil}}, urls("198.18.0.1", "198.18.0.2")},
	}
	for _, st := range steps {
		s, _ = k.update(t, s, st.addrs...)
		rec.wait(t, RoleDecode, st.want...)
		u := <-upd
		if u.Initial || u.Latency <= 0 || u.Event.IsZero() || u.Applied.Before(u.Event) {
			t.Errorf("%s: update %+v, want a latency", st.name, u)
		}
		updates = append(updates, u)
	}

	// An update that changes nothing the proxy uses calls nothing.
	calls := len(rec.of(RoleDecode))
	s.Labels["unrelated"] = "x"
	s, err := k.client.DiscoveryV1().EndpointSlices(k.ns).Update(context.Background(), s, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s, _ = k.update(t, s, ready("198.18.0.2"), ready("198.18.0.1")) // same set, other order
	waitEvents(t, reg, RoleDecode, "update", len(steps)+2)
	// The barrier: a change that does call, after which nothing earlier
	// can still arrive.
	s, _ = k.update(t, s, ready("198.18.0.2"), ready("198.18.0.1"), ready("198.18.0.3"))
	if extra := rec.callsBefore(t, RoleDecode, calls, urls("198.18.0.1", "198.18.0.2", "198.18.0.3")...); len(extra) > 0 {
		t.Errorf("SetBackends calls %v for updates that left the set as it was", extra)
	}
	<-upd

	k.delete(t, s.Name)
	rec.wait(t, RoleDecode)
	<-upd

	// The initial list, the steps, the barrier and the delete.
	if n := promtest.ToFloat64(w.metrics.updates.WithLabelValues(RoleDecode, "ok")); n != float64(len(steps)+3) {
		t.Errorf("updates_total{ok} = %v, want %d", n, len(steps)+3)
	}
	if n := promtest.ToFloat64(w.metrics.backends.WithLabelValues(RoleDecode)); n != 0 {
		t.Errorf("backends gauge = %v after the delete", n)
	}
	if n := promtest.ToFloat64(w.metrics.synced.WithLabelValues(RoleDecode)); n != 1 {
		t.Errorf("synced gauge = %v", n)
	}
	if n := promtest.CollectAndCount(reg, "tandem:proxy_discovery_update_seconds"); n != 1 {
		t.Errorf("update_seconds has %d series, want 1", n)
	}
	t.Logf("change latencies (informer event to SetBackends returned): %v", latencies(updates))
}

func TestTwoSlicesOfOneServiceMerge(t *testing.T) {
	k := newKube(t)
	rec := newRecorder()
	a := k.create(t, slice("decode-a", "decode", nil, ready("198.18.0.1"), ready("198.18.0.2")))
	b := k.create(t, slice("decode-b", "decode", nil, ready("198.18.0.2"), ready("198.18.0.3"))) // .2 in both, as while the controller moves it
	v6 := k.create(t, slice("decode-v6", "decode", nil, ready("2001:db8::7")))
	k.run(t, Config{Pools: []Pool{{Role: RoleDecode, Selector: ServiceSelector("decode")}}, Backends: rec})
	rec.wait(t, RoleDecode, urls("198.18.0.1", "198.18.0.2", "198.18.0.3", "2001:db8::7")...)
	if got, _ := rec.last(RoleDecode); len(got) != 4 {
		t.Errorf("the endpoint in two slices is listed twice: %v", got)
	}
	// .2 leaves slice a but is still ready in b: no change.
	calls := len(rec.of(RoleDecode))
	k.update(t, a, ready("198.18.0.1"))
	barrier := k.create(t, slice("decode-barrier", "decode", nil, ready("198.18.0.8")))
	if extra := rec.callsBefore(t, RoleDecode, calls, urls("198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.0.8", "2001:db8::7")...); len(extra) > 0 {
		t.Errorf("moving an endpoint between slices changed the set: %v", extra)
	}
	k.delete(t, barrier.Name)
	k.delete(t, b.Name)
	rec.wait(t, RoleDecode, urls("198.18.0.1", "2001:db8::7")...)
	k.delete(t, v6.Name)
	rec.wait(t, RoleDecode, urls("198.18.0.1")...)
}

func TestRolesAreIsolated(t *testing.T) {
	k := newKube(t)
	other := newKube(t) // same Service names in another namespace
	rec := newRecorder()
	k.create(t, slice("prefill-a", "tandem-prefill", nil, ready("198.18.0.1")))
	k.create(t, slice("decode-a", "tandem-decode", map[string]string{"app": "tandem", "role": "decode"}, ready("198.18.0.2")))
	k.create(t, slice("decode-canary", "tandem-decode-canary", map[string]string{"app": "tandem", "role": "decode", "track": "canary"}, ready("198.18.0.3")))
	k.create(t, slice("other", "something-else", map[string]string{"app": "other"}, ready("198.18.0.4")))
	other.create(t, slice("prefill-x", "tandem-prefill", nil, ready("198.18.1.1")))
	other.create(t, slice("decode-x", "tandem-decode", map[string]string{"app": "tandem", "role": "decode"}, ready("198.18.1.2")))
	k.run(t, Config{Backends: rec, Pools: []Pool{
		{Role: RolePrefill, Selector: ServiceSelector("tandem-prefill")},
		{Role: RoleDecode, Selector: "app=tandem,role=decode,track!=canary"},
	}})
	rec.wait(t, RolePrefill, urls("198.18.0.1")...)
	rec.wait(t, RoleDecode, urls("198.18.0.2")...)

	// A new prefill slice changes the prefill pool only.
	decodeCalls := len(rec.of(RoleDecode))
	k.create(t, slice("prefill-b", "tandem-prefill", nil, ready("198.18.0.5")))
	other.create(t, slice("prefill-y", "tandem-prefill", nil, ready("198.18.1.5")))
	rec.wait(t, RolePrefill, urls("198.18.0.1", "198.18.0.5")...)
	k.create(t, slice("decode-barrier", "tandem-decode", map[string]string{"app": "tandem", "role": "decode"}, ready("198.18.0.8")))
	if extra := rec.callsBefore(t, RoleDecode, decodeCalls, urls("198.18.0.2", "198.18.0.8")...); len(extra) > 0 {
		t.Errorf("a prefill slice called SetBackends(decode): %v", extra)
	}
	for _, c := range append(rec.of(RolePrefill), rec.of(RoleDecode)...) {
		for _, u := range c.urls {
			if strings.Contains(u, "198.18.1.") || strings.Contains(u, "198.18.0.3") || strings.Contains(u, "198.18.0.4") {
				t.Errorf("%s got %s from a slice it does not select", c.role, u)
			}
		}
	}
}

func TestEmptySelectorGivesAnEmptyPoolLoggedOnce(t *testing.T) {
	k := newKube(t)
	rec := newRecorder()
	_, logs, _ := k.run(t, Config{Backends: rec, Pools: []Pool{
		{Role: RolePrefill, Selector: ServiceSelector("nothing-here")},
		{Role: RoleDecode, Selector: ServiceSelector("decode")},
	}})
	c := rec.wait(t, RolePrefill)
	if c.urls != nil {
		t.Errorf("initial prefill set %v, want empty", c.urls)
	}
	rec.wait(t, RoleDecode)
	// A slice of the service with only unready endpoints, updated twice:
	// the set stays empty, nothing is called, the warning is not repeated.
	s := k.create(t, slice("decode-a", "decode", nil, unready("198.18.0.1")))
	s, _ = k.update(t, s, unready("198.18.0.1"), unready("198.18.0.2"))
	k.update(t, s, terminating("198.18.0.1"))
	k.create(t, slice("decode-barrier", "decode", nil, ready("198.18.0.8")))
	if extra := rec.callsBefore(t, RoleDecode, 1, urls("198.18.0.8")...); len(extra) > 0 {
		t.Errorf("SetBackends(decode) called for a set that stayed empty: %v", extra)
	}
	if n := logs.count("no ready endpoint matches"); n != 2 {
		t.Errorf("the empty-pool warning was logged %d times, want once per role:\n%s", n, logs)
	}
}

// TestWatchRestart cuts the watches while the slices change: the informer
// watches again (or relists) and the set converges, with no call for what
// did not change. A second Watcher started afterwards (a restarted proxy)
// starts from the current set.
func TestWatchRestart(t *testing.T) {
	k := newKube(t)
	rec := newRecorder()
	f := newFaults()
	client := clientFor(t, k.cp, f.wrap)
	s := k.create(t, slice("decode-a", "decode", nil, ready("198.18.0.1"), ready("198.18.0.2")))
	keep := k.create(t, slice("prefill-a", "prefill", nil, ready("198.18.0.9")))
	w, logs, stop := k.run(t, Config{Client: client, Backends: rec, Pools: []Pool{
		{Role: RoleDecode, Selector: ServiceSelector("decode")},
		{Role: RolePrefill, Selector: ServiceSelector("prefill")},
	}})
	rec.wait(t, RoleDecode, urls("198.18.0.1", "198.18.0.2")...)
	rec.wait(t, RolePrefill, urls("198.18.0.9")...)
	testutil.WaitFor(t, "both watches open", waitLimit, func() bool { return f.open() == 2 })

	// The watches drop and the API server is unreachable for a while; the
	// slices change meanwhile.
	f.down.Store(true)
	if n := f.cut(); n != 2 {
		t.Fatalf("cut %d watches, want 2", n)
	}
	s, _ = k.update(t, s, ready("198.18.0.2"), ready("198.18.0.3"))
	// Both informers retry, fail, and count it.
	testutil.WaitFor(t, "both informers to count a watch error", waitLimit, func() bool {
		return promtest.ToFloat64(w.metrics.watchErrors.WithLabelValues(RoleDecode)) > 0 &&
			promtest.ToFloat64(w.metrics.watchErrors.WithLabelValues(RolePrefill)) > 0
	})
	if got, _ := rec.last(RoleDecode); diffSets(urls("198.18.0.1", "198.18.0.2"), got) != "" {
		t.Errorf("while the API server is down the set changed to %v; the last known one should stay", got)
	}
	prefillCalls := len(rec.of(RolePrefill))
	f.down.Store(false)
	rec.wait(t, RoleDecode, urls("198.18.0.2", "198.18.0.3")...)
	testutil.WaitFor(t, "both watches open again", waitLimit, func() bool { return f.open() == 2 })
	if n := len(rec.of(RolePrefill)); n != prefillCalls {
		t.Errorf("the prefill pool, unchanged across the outage, got %d calls", n-prefillCalls)
	}
	if logs.count("EndpointSlice watch failed") == 0 {
		t.Errorf("the failed watch is not logged:\n%s", logs)
	}
	// Watching again works: the next change arrives.
	k.update(t, s, ready("198.18.0.3"))
	rec.wait(t, RoleDecode, urls("198.18.0.3")...)

	// A new Watcher (the proxy restarted) starts from the current state.
	stop()
	k.delete(t, keep.Name)
	rec2 := newRecorder()
	k.run(t, Config{Backends: rec2, Pools: []Pool{
		{Role: RoleDecode, Selector: ServiceSelector("decode")},
		{Role: RolePrefill, Selector: ServiceSelector("prefill")},
	}})
	rec2.wait(t, RoleDecode, urls("198.18.0.3")...)
	rec2.wait(t, RolePrefill)
}

// TestAPIServerDownAtStart: until the first list succeeds nothing is
// handed to the proxy (its static backends keep serving); the informer
// retries with backoff and the set arrives once the API server answers.
func TestAPIServerDownAtStart(t *testing.T) {
	k := newKube(t)
	k.create(t, slice("decode-a", "decode", nil, ready("198.18.0.1")))
	rec := newRecorder()
	f := newFaults()
	f.down.Store(true)
	w, logs, _ := k.run(t, Config{Client: clientFor(t, k.cp, f.wrap), Backends: rec, Pools: []Pool{{Role: RoleDecode, Selector: ServiceSelector("decode")}}})
	testutil.WaitFor(t, "the informer to retry the list", waitLimit, func() bool { return f.refused.Load() >= 2 })
	if cs := rec.of(RoleDecode); len(cs) != 0 || w.Synced() {
		t.Errorf("with the API server down: calls %v, synced %v; want none (the static list serves)", cs, w.Synced())
	}
	// The refused dial returns before the informer logs the failed list.
	testutil.WaitFor(t, "the failed list to be logged", waitLimit, func() bool { return logs.count("cannot list EndpointSlices") > 0 })
	f.down.Store(false)
	rec.wait(t, RoleDecode, urls("198.18.0.1")...)
	testutil.WaitFor(t, "the watcher to be synced", waitLimit, w.Synced)
}

// TestSetBackendsErrorIsRetried: a set the proxy refuses is handed again
// with backoff until it is taken.
func TestSetBackendsErrorIsRetried(t *testing.T) {
	k := newKube(t)
	k.create(t, slice("decode-a", "decode", nil, ready("198.18.0.1")))
	rec := newRecorder()
	rec.fail.Store(2)
	w, _, _ := k.run(t, Config{Backends: rec, Pools: []Pool{{Role: RoleDecode, Selector: ServiceSelector("decode")}}})
	rec.wait(t, RoleDecode, urls("198.18.0.1")...)
	testutil.WaitFor(t, "the watcher to be synced", waitLimit, w.Synced)
	if n := promtest.ToFloat64(w.metrics.updates.WithLabelValues(RoleDecode, "error")); n != 2 {
		t.Errorf("updates_total{error} = %v, want 2", n)
	}
}

// waitEvents waits until the informer has delivered n events of kind.
func waitEvents(t testing.TB, reg *prometheus.Registry, role, kind string, n int) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("%d %s events of %s", n, kind, role), waitLimit, func() bool {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "tandem:proxy_discovery_events_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				var r, k string
				for _, l := range m.GetLabel() {
					switch l.GetName() {
					case "role":
						r = l.GetValue()
					case "type":
						k = l.GetValue()
					}
				}
				if r == role && k == kind && m.GetCounter().GetValue() >= float64(n) {
					return true
				}
			}
		}
		return false
	})
}

func latencies(us []Update) string {
	var parts []string
	for _, u := range us {
		parts = append(parts, fmt.Sprint(u.Latency.Round(time.Microsecond)))
	}
	return strings.Join(parts, " ")
}
