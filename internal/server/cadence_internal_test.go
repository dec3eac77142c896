package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

type fakeCadence struct{ n int }

func (f *fakeCadence) PrefillScheduleInterval() int { return f.n }

func (f *fakeCadence) SetPrefillScheduleInterval(_ context.Context, n int) (int, error) {
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
