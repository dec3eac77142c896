package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestOutputCountReadsUsageOrCountsEvents feeds answers to the count in
// pieces of every size: a stream's events are counted ([DONE] is not,
// nor "data: " inside a token's text), a usage's completion_tokens wins.
func TestOutputCountReadsUsageOrCountsEvents(t *testing.T) {
	event := func(text string) string { return `data: {"choices":[{"text":"` + text + `"}]}` + "\n\n" }
	for _, c := range []struct {
		name   string
		answer string
		stream bool
		want   int
		ok     bool
	}{
		{"a stream", event("a") + event("data: b") + event("c") + "data: [DONE]\n\n", true, 3, true},
		{"a stream with usage", event("a") + event("b") + `data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}` + "\n\ndata: [DONE]\n\n", true, 2, true},
		{"a whole answer", `{"choices":[{"text":"abc"}],"usage":{"prompt_tokens":9,"completion_tokens": 17,"total_tokens":26}}`, false, 17, true},
		{"a whole answer without usage", `{"choices":[{"text":"abc"}]}`, false, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			for size := 1; size <= len(c.answer); size++ {
				oc := &outputCount{carry: []byte("\n")}
				for i := 0; i < len(c.answer); i += size {
					oc.feed([]byte(c.answer[i:min(i+size, len(c.answer))]))
				}
				if n, ok := oc.tokens(c.stream); n != c.want || ok != c.ok {
					t.Fatalf("in pieces of %d bytes: %d tokens (ok %v), want %d (%v)", size, n, ok, c.want, c.ok)
				}
			}
		})
	}
}

// TestPlannerCountsWhatTheEnginesProduced: the planner takes a finished
// request's output from its answer's usage, not its max_tokens.
func TestPlannerCountsWhatTheEnginesProduced(t *testing.T) {
	usage := func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-2","choices":[{"text":"hello"}],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}`)
	}
	p, url := startProxy(t, Config{PDDecider: "conditional", Planner: plannerConfig(), PlanInterval: time.Hour},
		[]*fakeEngine{newFake(t, prefillOK)}, []*fakeEngine{newFake(t, usage)})
	for range 6 {
		if r, body := post(t, url, "/v1/completions", `{"model":"m","prompt":"hello there","max_tokens":100}`, nil); r.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", r.StatusCode, body)
		}
	}
	d := p.planOnce(time.Now())
	if d.Fit.FinishedOutputs != 6 || d.Fit.MeanOutput != 7 {
		t.Fatalf("%d finished outputs, mean output %v; want 6 at the 7 tokens produced, not max_tokens 100", d.Fit.FinishedOutputs, d.Fit.MeanOutput)
	}
	if strings.Contains(d.Held, "too few requests") {
		t.Fatalf("held %q", d.Held)
	}
}
