package soak

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/bench"
)

func TestScheduleAlternatesKindsAndRoles(t *testing.T) {
	got := Schedule(49*time.Second, 5*time.Second, 2*time.Second, []string{"p0", "p1"}, []string{"d0", "d1"})
	var short []string
	for _, f := range got {
		short = append(short, fmt.Sprintf("%v %s %s", f.At, f.Kind, f.Engine))
	}
	want := []string{
		"5s kill -9 + restart p0", "10s SIGSTOP/SIGCONT d0", "15s SIGSTOP/SIGCONT p0", "20s kill -9 + restart d0",
		"25s kill -9 + restart p1", "30s SIGSTOP/SIGCONT d1", "35s SIGSTOP/SIGCONT p1", "40s kill -9 + restart d1",
	}
	if diff := cmp.Diff(want, short); diff != "" {
		t.Errorf("schedule (-want +got):\n%s", diff)
	}
	for _, f := range got {
		if f.Kind == Stall && f.Stall != 2*time.Second {
			t.Errorf("%v: stall %v, want 2s", f, f.Stall)
		}
	}
	t.Run("a run shorter than two periods still gets its first fault", func(t *testing.T) {
		if got := Schedule(7*time.Second, 5*time.Second, time.Second, []string{"p"}, []string{"d"}); len(got) != 1 {
			t.Errorf("got %v, want one fault", got)
		}
	})
	t.Run("no period means no faults", func(t *testing.T) {
		if got := Schedule(time.Minute, 0, time.Second, []string{"p"}, []string{"d"}); got != nil {
			t.Errorf("got %v", got)
		}
	})
}

func TestClassify(t *testing.T) {
	for _, tt := range []struct {
		name string
		o    bench.Outcome
		want string
	}{
		{"a remote request is ok", bench.Outcome{PD: "remote"}, KindRemote},
		{"a fallback keeps its reason", bench.Outcome{PD: "fallback; reason=prefill_unreachable"}, KindFallback + " (reason=prefill_unreachable)"},
		{"no header is ok", bench.Outcome{}, KindOK},
		{"the deadline is a hang", bench.Outcome{Err: fmt.Errorf("%w (read: x)", context.DeadlineExceeded)}, KindHung},
		{"an HTTP status is named", bench.Outcome{Err: errors.New("HTTP 502: no decode engine")}, "error: HTTP 502"},
		{"a refused connection", bench.Outcome{Err: &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}, "error: connection refused"},
		{"a cut stream", bench.Outcome{Err: errors.New("stream ended before [DONE]")}, "error: stream cut before [DONE]"},
		{"an error event", bench.Outcome{Err: errors.New("server error in stream: boom")}, "error: error event in stream"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.o); got != tt.want {
				t.Errorf("Classify = %q, want %q", got, tt.want)
			}
			if IsFailure(tt.want) != (tt.o.Err != nil) {
				t.Errorf("IsFailure(%q) = %v", tt.want, IsFailure(tt.want))
			}
		})
	}
}

func TestParseGauge(t *testing.T) {
	text := `# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="a b"} 0.25
vllm:kv_cache_usage_perc_other 7
tandem:kv_blocks_held 3
tandem:kv_blocks_held{x="1"} 2
`
	if v, ok, err := ParseGauge(strings.NewReader(text), MetricKVUsage); v != 0.25 || !ok || err != nil {
		t.Errorf("usage = %v %v %v", v, ok, err)
	}
	if v, ok, _ := ParseGauge(strings.NewReader(text), MetricHeld); v != 5 || !ok {
		t.Errorf("held = %v %v, want the sum 5", v, ok)
	}
	if _, ok, _ := ParseGauge(strings.NewReader(text), "absent"); ok {
		t.Error("absent metric reported present")
	}
}

func life(mibs ...int64) *Life {
	l := &Life{Engine: "e", PID: 1}
	for i, m := range mibs {
		l.Samples = append(l.Samples, RSSSample{At: time.Duration(i) * time.Second, Bytes: m << 20})
	}
	return l
}

func TestRSSLimit(t *testing.T) {
	lim := RSSLimit{Fraction: 0.25, Slack: 16 << 20}
	for _, tt := range []struct {
		name string
		l    *Life
		fail bool
	}{
		{"warm-up growth in the first half is allowed", life(10, 100, 100, 100, 101, 100), false},
		{"steady growth past the tolerance fails", life(100, 120, 140, 160, 180, 200), true},
		{"small growth within the slack passes", life(10, 10, 12, 20), false},
		{"too few samples pass", life(10, 500), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if msg := lim.Check(tt.l); (msg != "") != tt.fail {
				t.Errorf("Check = %q, want failure %v", msg, tt.fail)
			}
		})
	}
}

func TestFailures(t *testing.T) {
	ok := &Result{Tally: Tally{KindRemote: 3, "error: HTTP 502": 1}, Drain: []Drained{{Engine: "p0"}}}
	if f := Failures(ok, RSSLimit{}); len(f) != 0 {
		t.Errorf("errors during faults are not failures: %v", f)
	}
	bad := &Result{Tally: Tally{KindHung: 1}, Hung: 1, Deadline: time.Second,
		Drain:  []Drained{{Engine: "d0", Usage: 0.1, Held: 0}, {Engine: "p0", Held: 2, HeldSeen: true}},
		Faults: []FaultResult{{Fault: Fault{Kind: Kill, Engine: "p0"}, Err: "did not restart"}}}
	got := strings.Join(Failures(bad, RSSLimit{}), "\n")
	for _, want := range []string{"1 requests hung", "no request succeeded", "d0 still holds KV", "p0 still holds KV", "did not restart"} {
		if !strings.Contains(got, want) {
			t.Errorf("failures lack %q:\n%s", want, got)
		}
	}
}

// TestRunCountsHungRequestsAndWaitsForTheDrain runs a soak against a fake
// server whose every third request never answers and whose KV gauge
// reaches 0 only after a moment.
func TestRunCountsHungRequestsAndWaitsForTheDrain(t *testing.T) {
	stop := make(chan struct{})
	var n atomic.Int64
	var drained atomic.Int64 // unix ns after which the gauge reads 0
	drained.Store(time.Now().Add(time.Hour).UnixNano())
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%3 == 0 {
			select {
			case <-r.Context().Done():
			case <-stop:
			}
			return
		}
		w.Header().Set("X-Tandem-Pd", "remote")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n")
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		v := 0.5
		if time.Now().UnixNano() > drained.Load() {
			v = 0
		}
		fmt.Fprintf(w, "vllm:kv_cache_usage_perc %g\n", v)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	defer close(stop) // before Close, which waits for the handlers
	var injected []Fault
	cfg := Config{Client: bench.NewClient(srv.URL, 4), Model: "m", Prompts: [][]int32{{1, 2}}, MaxTokens: 2,
		Concurrency: 1, Duration: 600 * time.Millisecond, Deadline: 100 * time.Millisecond,
		Faults: []Fault{{At: 100 * time.Millisecond, Kind: Stall, Engine: "p0"}},
		Inject: func(_ context.Context, f Fault) error {
			injected = append(injected, f)
			drained.Store(time.Now().Add(time.Second).UnixNano())
			return nil
		},
		PIDs: func() map[string]int { return map[string]int{"self": os.Getpid()} }, SampleEvery: 50 * time.Millisecond,
		MetricsURLs: map[string]string{"p0": srv.URL}, DrainTimeout: 5 * time.Second}
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Hung == 0 || res.Tally[KindRemote] == 0 || res.Hung+res.Tally[KindRemote] != res.Sent {
		t.Errorf("sent %d, tally %v, hung %d: want both hung and remote requests, all counted", res.Sent, res.Tally, res.Hung)
	}
	if len(injected) != 1 || len(res.Faults) != 1 {
		t.Errorf("injected %v, results %v: want the one fault", injected, res.Faults)
	}
	if len(res.Drain) != 1 || res.Drain[0].Usage != 0 || res.Drain[0].After < 200*time.Millisecond {
		t.Errorf("drain %+v: want usage 0 reached after waiting", res.Drain)
	}
	if len(res.Lives) != 1 || len(res.Lives[0].Samples) < 5 {
		t.Errorf("lives %+v: want this process sampled throughout", res.Lives)
	}
	if f := Failures(res, RSSLimit{Fraction: 1, Slack: 1 << 30}); len(f) != 1 || !strings.Contains(f[0], "hung") {
		t.Errorf("failures %v, want only the hung requests", f)
	}
}
