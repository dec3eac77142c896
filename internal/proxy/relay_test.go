package proxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDecodeAnswerRelayed(t *testing.T) {
	pre := newFake(t, prefillOK)
	dec := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Header().Set("X-Engine", "d0")
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, `{"any":"thing"}`)
	})
	_, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})
	resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`, nil)
	got := map[string]string{
		"status":       resp.Status,
		"content-type": resp.Header.Get("Content-Type"),
		"x-engine":     resp.Header.Get("X-Engine"),
		"body":         body,
	}
	want := map[string]string{
		"status":       "418 I'm a teapot",
		"content-type": "application/json; charset=utf-8",
		"x-engine":     "d0",
		"body":         `{"any":"thing"}`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("relayed answer (-want +got):\n%s", diff)
	}
}

func TestStreamingRelayChunkByChunk(t *testing.T) {
	events := []string{
		"data: {\"choices\":[{\"text\":\"Once\"}]}\n\n",
		"data: {\"choices\":[{\"text\":\" upon\"}]}\n\n",
		"data: [DONE]\n\n",
	}
	ack := make(chan struct{})
	pre := newFake(t, prefillOK)
	dec := newFake(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			io.WriteString(w, e)
			w.(http.Flusher).Flush()
			// The next event is written only once the client has seen
			// this one: a proxy that buffered would stall the test.
			select {
			case <-ack:
			case <-r.Context().Done():
				return
			}
		}
	})
	_, url := startProxy(t, Config{Fallback: true}, []*fakeEngine{pre}, []*fakeEngine{dec})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(`{"prompt":"x","stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type %q, want text/event-stream", ct)
	}
	br := bufio.NewReader(resp.Body)
	for i, want := range events {
		var got strings.Builder
		for !strings.HasSuffix(got.String(), "\n\n") {
			line, err := br.ReadString('\n')
			got.WriteString(line)
			if err != nil {
				t.Fatalf("event %d: %v (got %q so far)", i, err, got.String())
			}
		}
		if got.String() != want {
			t.Errorf("event %d = %q, want %q", i, got.String(), want)
		}
		ack <- struct{}{}
	}
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Errorf("data after [DONE]: %q", rest)
	}
}
