package proxy

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestServerTimingKeepsTheEnginesAndAddsTheProxys: the client's answer
// carries the decode engine's Server-Timing entries unchanged, then the
// proxy's prefill_leg (at least the prefill engine's 30 ms) and proxy
// entries, in one header line; a fallback still reports the failed leg's
// time, and a decode without entries of its own gets the proxy's alone.
func TestServerTimingKeepsTheEnginesAndAddsTheProxys(t *testing.T) {
	const engine = "api;dur=0.100, queue;dur=1.000, kv_pull;dur=2.500, prefill;dur=3.000"
	slowPrefill := func(w http.ResponseWriter, r *http.Request, body []byte) {
		time.Sleep(30 * time.Millisecond)
		prefillOK(w, r, body)
	}
	failingPrefill := func(w http.ResponseWriter, r *http.Request, body []byte) {
		time.Sleep(30 * time.Millisecond)
		w.WriteHeader(http.StatusInternalServerError)
	}
	decodeWith := func(st string) func(w http.ResponseWriter, r *http.Request, body []byte) {
		return func(w http.ResponseWriter, r *http.Request, body []byte) {
			if st != "" {
				w.Header().Set("Server-Timing", st)
			}
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"cmpl-2","choices":[{"text":"hello"}]}`)
		}
	}
	for _, tc := range []struct {
		name    string
		prefill func(w http.ResponseWriter, r *http.Request, body []byte)
		decode  string
		want    *regexp.Regexp
	}{
		{"a remote request", slowPrefill, engine,
			regexp.MustCompile(`^` + regexp.QuoteMeta(engine) + `, prefill_leg;dur=([0-9.]+), proxy;dur=([0-9.]+)$`)},
		{"a fallback after a failed prefill leg", failingPrefill, engine,
			regexp.MustCompile(`^` + regexp.QuoteMeta(engine) + `, prefill_leg;dur=([0-9.]+), proxy;dur=([0-9.]+)$`)},
		{"a decode engine that sends no Server-Timing", slowPrefill, "",
			regexp.MustCompile(`^prefill_leg;dur=([0-9.]+), proxy;dur=([0-9.]+)$`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, d := newFake(t, tc.prefill), newFake(t, decodeWith(tc.decode))
			_, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{p}, []*fakeEngine{d})
			start := time.Now()
			resp, _ := post(t, url, "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":4}`, nil)
			waited := time.Since(start)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if vs := resp.Header.Values("Server-Timing"); len(vs) != 1 {
				t.Fatalf("Server-Timing lines %q, want one", vs)
			}
			m := tc.want.FindStringSubmatch(resp.Header.Get("Server-Timing"))
			if m == nil {
				t.Fatalf("Server-Timing %q, want %v", resp.Header.Get("Server-Timing"), tc.want)
			}
			leg, _ := strconv.ParseFloat(m[1], 64)
			proxy, _ := strconv.ParseFloat(m[2], 64)
			if leg < 30 || proxy < 0 || time.Duration((leg+proxy)*float64(time.Millisecond)) > waited {
				t.Errorf("prefill_leg %v ms and proxy %v ms: want a leg of at least the prefill's 30 ms, both within the %v the client waited", leg, proxy, waited)
			}
		})
	}
}
