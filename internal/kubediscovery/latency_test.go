package kubediscovery

import (
	"fmt"
	"testing"
	"time"
)

// measureLatency makes n changes to a slice through the real API server
// (an endpoint of four turned unready, then ready again, by turns) and
// returns for each the time from the Update call to SetBackends returning
// (what the proxy's user sees) and from the informer event to SetBackends
// returning (the Watcher's own part).
func measureLatency(tb testing.TB, n int) (api, event []time.Duration) {
	k := newKube(tb)
	rec := newRecorder()
	upd := make(chan Update, n+1)
	ips := []string{"198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.0.4"}
	all := func(except int) []addr {
		var out []addr
		for i, ip := range ips {
			if i == except {
				out = append(out, unready(ip))
			} else {
				out = append(out, ready(ip))
			}
		}
		return out
	}
	s := k.create(tb, slice("decode-a", "decode", nil, all(-1)...))
	k.run(tb, Config{Backends: rec, Pools: []Pool{{Role: RoleDecode, Selector: ServiceSelector("decode")}}, OnUpdate: func(u Update) { upd <- u }})
	rec.wait(tb, RoleDecode, urls(ips...)...)
	<-upd
	for i := range n {
		except := -1
		if i%2 == 0 {
			except = (i / 2) % len(ips)
		}
		var begin time.Time
		s, begin = k.update(tb, s, all(except)...)
		var u Update
		select {
		case u = <-upd:
		case <-time.After(15 * time.Second):
			tb.Fatalf("change %d: no SetBackends within 15 s", i)
		}
		want := 4
		if except >= 0 {
			want = 3
		}
		if u.Err != nil || len(u.URLs) != want {
			tb.Fatalf("change %d: update %+v, want %d backends", i, u, want)
		}
		api = append(api, u.Applied.Sub(begin))
		event = append(event, u.Latency)
	}
	return api, event
}

// TestUpdateLatency measures how long the proxy takes to act on an
// EndpointSlice change, over 50 changes, and bounds it loosely (the
// numbers are in the log; BenchmarkEndpointSliceToSetBackends reports
// them as metrics).
func TestUpdateLatency(t *testing.T) {
	api, event := measureLatency(t, 50)
	t.Logf("EndpointSlice update call -> SetBackends returned: p50 %v p99 %v max %v", percentile(api, 50), percentile(api, 99), percentile(api, 100))
	t.Logf("informer event -> SetBackends returned: p50 %v p99 %v max %v", percentile(event, 50), percentile(event, 99), percentile(event, 100))
	if p := percentile(api, 99); p > 5*time.Second {
		t.Errorf("p99 %v from an EndpointSlice update to the proxy's set: want well under a second", p)
	}
}

// BenchmarkEndpointSliceToSetBackends: one op is one EndpointSlice change
// through the real API server until the Watcher has handed the new set to
// Backends. Run with -benchtime=50x for 50 changes.
func BenchmarkEndpointSliceToSetBackends(b *testing.B) {
	api, event := measureLatency(b, b.N)
	for _, m := range []struct {
		name string
		ds   []time.Duration
	}{{"api", api}, {"event", event}} {
		for _, p := range []float64{50, 99} {
			b.ReportMetric(float64(percentile(m.ds, p).Microseconds())/1000, fmt.Sprintf("%s-p%.0f-ms", m.name, p))
		}
	}
}
