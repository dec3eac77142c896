package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAdminBackends(t *testing.T) {
	pre := []*fakeEngine{newFake(t, prefillOK)}
	d0, d1 := newFake(t, decodeJSON), newFake(t, decodeJSON)
	_, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1, APIKey: "k"}, pre, []*fakeEngine{d0})
	auth := http.Header{"Authorization": {"Bearer k"}}
	admin := func(method, body string, h http.Header) (int, string) {
		req, _ := http.NewRequest(method, url+AdminBackendsPath, strings.NewReader(body))
		for k, v := range h {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := admin(http.MethodPost, `{"role":"decode","url":"`+d1.URL()+`"}`, nil); code != http.StatusUnauthorized {
		t.Errorf("admin without the key: %d, want 401", code)
	}
	if code, body := admin(http.MethodPost, `{"role":"decode","url":"`+d1.URL()+`"}`, auth); code != http.StatusOK || !strings.Contains(body, d1.URL()) {
		t.Fatalf("adding a decode: %d %s", code, body)
	}
	for i := range 4 {
		post(t, url, "/v1/completions", `{"prompt":"x"}`, http.Header{"Authorization": {"Bearer k"}, "X-Request-Id": {fmt.Sprintf("a%d", i)}})
	}
	if c := counts([]*fakeEngine{d0, d1}); c[1] == 0 {
		t.Errorf("the added decode got no request: %v", c)
	}
	if code, body := admin(http.MethodDelete, `{"role":"decode","url":"`+d0.URL()+`"}`, auth); code != http.StatusOK || strings.Contains(body, d0.URL()) {
		t.Fatalf("removing a decode: %d %s", code, body)
	}
	before := counts([]*fakeEngine{d0})[0]
	for range 3 {
		post(t, url, "/v1/completions", `{"prompt":"x"}`, http.Header{"Authorization": {"Bearer k"}})
	}
	if after := counts([]*fakeEngine{d0})[0]; after != before {
		t.Errorf("the removed decode still got %d requests", after-before)
	}
	if code, _ := admin(http.MethodPost, `{"role":"nope","url":"http://x:1"}`, auth); code != http.StatusBadRequest {
		t.Errorf("bad role: %d, want 400", code)
	}
}

func TestAdminBackendsNeedsAnAPIKey(t *testing.T) {
	_, url := startProxy(t, Config{ScrapeInterval: -1}, []*fakeEngine{newFake(t, prefillOK)}, []*fakeEngine{newFake(t, decodeJSON)})
	resp, _ := post(t, url, AdminBackendsPath, `{"role":"decode","url":"http://127.0.0.1:1"}`, nil)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("admin without a configured key: %d, want 403", resp.StatusCode)
	}
}

func TestBackendsFileIsWatched(t *testing.T) {
	pre, d0, d1 := newFake(t, prefillOK), newFake(t, decodeJSON), newFake(t, decodeJSON)
	file := filepath.Join(t.TempDir(), "backends")
	write := func(decodes ...*fakeEngine) {
		s := "# engines\nprefill " + pre.URL() + "\n"
		for _, d := range decodes {
			s += "decode " + d.URL() + "  # a comment\n"
		}
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(d0)
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1, BackendsFile: file, HealthInterval: 10 * time.Millisecond}, nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.watchBackendsFile(ctx)
	if resp, _ := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("with the file's backends: %d", resp.StatusCode)
	}
	time.Sleep(20 * time.Millisecond) // a different modification time
	write(d1)
	waitFor(t, func() bool { l := p.decode.list(); return len(l) == 1 && l[0].base == d1.URL() && l[0].healthy.Load() })
	post(t, url, "/v1/completions", `{"prompt":"x"}`, http.Header{"X-Request-Id": {"after"}})
	if whichGot([]*fakeEngine{d0, d1}, "after") != 1 {
		t.Error("the request after the file changed did not go to the new decode")
	}
	if _, _, err := parseBackendsFile([]byte("decode\n")); err == nil {
		t.Error("a line without URL parsed")
	}
}
