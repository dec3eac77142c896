package proxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

func TestExactTokenCounts(t *testing.T) {
	dir := t.TempDir()
	if _, err := tokenizer.WriteFixture(dir, tokenizer.FixtureOptions{VocabSize: 1024, ChatTemplate: true}); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 20)
	pre := []*fakeEngine{newFake(t, prefillOK)}
	dec := []*fakeEngine{newFake(t, decodeJSON)}
	want := len(tok.Encode(prompt, true))
	p, url := startProxy(t, Config{Fallback: true, ScrapeInterval: -1, Tokenizer: tok, PDDecider: "conditional", Policy: factory.PolicyPrefix,
		Router: factory.Options{Threshold: want + 1}}, pre, dec)

	route := func(path, body string) *router.Request {
		t.Helper()
		obj, err := parseObject([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return p.routeRequest(path, "x", []byte(body), obj)
	}
	req := route("/v1/completions", fmt.Sprintf(`{"prompt":%q}`, prompt))
	if !req.Exact || req.PromptTokens != want || len(req.BlockHashes) != want/16 {
		t.Errorf("completion: exact=%v tokens=%d blocks=%d, want exact %d tokens in %d blocks", req.Exact, req.PromptTokens, len(req.BlockHashes), want, want/16)
	}
	text, _ := tok.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: prompt}}, true)
	chat := route("/v1/chat/completions", fmt.Sprintf(`{"messages":[{"role":"user","content":%q}]}`, prompt))
	if !chat.Exact || chat.PromptTokens != len(tok.Encode(text, false)) {
		t.Errorf("chat: exact=%v tokens=%d, want the rendered template's %d", chat.Exact, chat.PromptTokens, len(tok.Encode(text, false)))
	}
	// The decision uses the exact count: one token under the threshold is
	// local, at the threshold remote.
	resp, _ := post(t, url, "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, prompt), nil)
	if got := resp.Header.Get(HeaderPD); got != "local; reason=short_uncached" {
		t.Errorf("threshold %d: %s = %q, want local", want+1, HeaderPD, got)
	}
	_, url2 := startProxy(t, Config{Fallback: true, ScrapeInterval: -1, Tokenizer: tok, PDDecider: "conditional",
		Router: factory.Options{Threshold: want}}, pre, dec)
	resp, _ = post(t, url2, "/v1/completions", fmt.Sprintf(`{"prompt":%q}`, prompt), nil)
	if got := resp.Header.Get(HeaderPD); got != "remote" {
		t.Errorf("threshold %d: %s = %q, want remote", want, HeaderPD, got)
	}
	if v := metricValue(t, p, "tandem:proxy_token_count_mode", map[string]string{"mode": "exact"}); v != 1 {
		t.Errorf("token count mode exact = %v, want 1", v)
	}
}
