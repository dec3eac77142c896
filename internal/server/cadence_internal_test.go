package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/engine"
)

type fakeCadence struct{ n int }

func (f *fakeCadence) PrefillScheduleInterval() int { return f.n }

func (f *fakeCadence) SetPrefillScheduleInterval(_ context.Context, n int) (int, error) {
	if n < 1 || n > engine.MaxPrefillScheduleInterval {
		return 0, &engine.InvalidRequestError{Param: "prefill_schedule_interval", Message: "out of range"}
	}
	prev := f.n
	f.n = n
	return prev, nil
}

// TestCadenceRouteRefusesOtherHostsWithoutAKey: an engine without an API
// key refuses a change from another host with 403, and with a key it takes
// one that carries the key from anywhere.
func TestCadenceRouteRefusesOtherHostsWithoutAKey(t *testing.T) {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	cases := []struct {
		name, key, remote, auth string
		want, interval          int
	}{
		{"no key, another host", "", "198.51.100.7:40000", "", http.StatusForbidden, 2},
		{"no key, IPv6 loopback", "", "[::1]:40000", "", http.StatusOK, 5},
		{"no key, IPv4-mapped loopback", "", "[::ffff:127.0.0.1]:40000", "", http.StatusOK, 5},
		{"a key, another host, the key", "k", "198.51.100.7:40000", "Bearer k", http.StatusOK, 5},
		{"a key, loopback, no key", "k", "127.0.0.1:40000", "", http.StatusUnauthorized, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeCadence{n: 2}
			h := withCadenceRoute(api, f, c.key)
			req := httptest.NewRequest(http.MethodPost, CadencePath, strings.NewReader(`{"prefill_schedule_interval":5}`))
			req.RemoteAddr = c.remote
			req.Header.Set("Content-Type", "application/json")
			if c.auth != "" {
				req.Header.Set("Authorization", c.auth)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != c.want || f.n != c.interval {
				t.Errorf("%d %s (interval %d), want %d and interval %d", rec.Code, rec.Body, f.n, c.want, c.interval)
			}
			if c.want == http.StatusForbidden && !strings.Contains(rec.Body.String(), "--api-key") {
				t.Errorf("the 403 does not say to start the engine with --api-key: %s", rec.Body)
			}
		})
	}
	rec := httptest.NewRecorder()
	withCadenceRoute(api, &fakeCadence{n: 1}, "").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/models", nil))
	if rec.Code != http.StatusTeapot {
		t.Errorf("another path: %d, want the API's answer", rec.Code)
	}
}

// FuzzCadenceRoute: whatever the body, the route answers 200 having set
// the one in-range integer it carried, or an OpenAI-shaped 4xx having set
// nothing.
func FuzzCadenceRoute(f *testing.F) {
	for _, s := range []string{`{"prefill_schedule_interval":4}`, `{"prefill_schedule_interval":0}`, `{}`, `[]`, `{"prefill_schedule_interval":1e400}`,
		`{"prefill_schedule_interval":4}{}`, `{"prefill_schedule_interval":-1}`, `{"prefill_schedule_interval":"4"}`, "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		fc := &fakeCadence{n: 2}
		h := withCadenceRoute(http.NotFoundHandler(), fc, "")
		req := httptest.NewRequest(http.MethodPost, CadencePath, strings.NewReader(body))
		req.RemoteAddr = "127.0.0.1:1"
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch {
		case rec.Code == http.StatusOK:
			var want CadenceRequest
			if json.Unmarshal([]byte(body), &want) != nil || want.PrefillScheduleInterval == nil || *want.PrefillScheduleInterval != fc.n || fc.n < 1 || fc.n > engine.MaxPrefillScheduleInterval {
				t.Fatalf("200 for %q, interval now %d", body, fc.n)
			}
		case rec.Code >= 400 && rec.Code < 500:
			var e struct {
				Error struct{ Message, Type string }
			}
			if json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error.Message == "" || fc.n != 2 {
				t.Fatalf("%d %s for %q (interval now %d): want an OpenAI-shaped error and the interval unchanged", rec.Code, rec.Body, body, fc.n)
			}
		default:
			t.Fatalf("%d for %q", rec.Code, body)
		}
	})
}
