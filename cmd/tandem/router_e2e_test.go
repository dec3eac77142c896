package main

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/tandem-serve/tandem/internal/proxy"
	"github.com/tandem-serve/tandem/internal/router/factory"
	"github.com/tandem-serve/tandem/internal/testutil/loaded"
)

// TestRouterWithRealEngines: one prefill and two decode engines serving
// stories260K behind a router with the model's tokenizer, the prefix policy
// and the conditional decider. A short prompt is prefilled on the decode, a
// long one remotely, and the long one again on the decode that caches it;
// every answer is the one a single engine gives.
func TestRouterWithRealEngines(t *testing.T) {
	pre := startEngine(t, "--role", "prefill", "--kv-port", "0")
	d0 := startEngine(t, "--role", "decode")
	d1 := startEngine(t, "--role", "decode")
	tok := loaded.Stories(t).Tokenizer
	short := "Once upon a time"
	long := pdPrompt + " " + pdPrompt
	if n := len(tok.Encode(long, true)); n < 64 {
		t.Fatalf("long prompt has %d tokens; the test needs more than the threshold 48", n)
	}
	_, url := startTestProxy(t, proxy.Config{Prefill: []string{pre}, Decode: []string{d0, d1}, Policy: factory.PolicyPrefix,
		PDDecider: "conditional", Router: factory.Options{Threshold: 48}, Tokenizer: tok, BlockSize: 16})
	waitHealthy(t, url)
	body := func(prompt string) string {
		return fmt.Sprintf(`{"model":"hf","prompt":%q,"max_tokens":12,"temperature":0}`, prompt)
	}
	for _, step := range []struct {
		name, prompt, wantPD string
	}{
		{"a short prompt is prefilled on the decode", short, "local; reason=short_uncached"},
		{"a long prompt is prefilled remotely", long, "remote"},
		{"the long prompt again finds its prefix cached on that decode", long, "local; reason=short_uncached"},
	} {
		t.Run(step.name, func(t *testing.T) {
			_, _, want := completion(t, d0, body(step.prompt), nil)
			status, pd, got := completion(t, url, body(step.prompt), nil)
			if status != http.StatusOK || pd != step.wantPD {
				t.Fatalf("status %d, x-tandem-pd %q (%s); want 200 and %q", status, pd, got, step.wantPD)
			}
			if got != want {
				t.Errorf("answer %q, a single engine's %q", got, want)
			}
		})
	}
}
