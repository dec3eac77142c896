package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/router"
	"github.com/tandem-serve/tandem/internal/testutil"
)

// Each leg's first-byte deadline and the relay's stall deadline, against
// hung engines (as under SIGSTOP: the connection is accepted, nothing
// comes). The proxy's Timeout stays at startProxy's 5s: every check that
// the answer came well before it shows the shorter deadline at work.
//
// Each runs in a testing/synctest bubble, the proxy, its engines and the
// client on an in-memory network: fake time advances only while all of
// them wait, so a healthy engine answers within any deadline however
// loaded the machine, and a hung one is cut exactly at its deadline.

const (
	testFirstByte = 200 * time.Millisecond
	testStall     = 200 * time.Millisecond
	// wellBefore is the bound on an answer that a deadline under test
	// cut short: far above it, far below Timeout.
	wellBefore = 3 * time.Second
)

// checkCutAt fails t unless took is at least deadline (the deadline was
// waited out) and well before the proxy's Timeout.
func checkCutAt(t *testing.T, took, deadline time.Duration) {
	t.Helper()
	if took < deadline || took > wellBefore {
		t.Errorf("answered after %v; the deadline is %v, the proxy's Timeout 5s", took, deadline)
	}
}

// hangs never answers: it waits until the proxy gives up on the leg.
func hangs(w http.ResponseWriter, r *http.Request, body []byte) {
	<-r.Context().Done()
}

// hangsAfterHeaders sends a stream's headers, then nothing.
func hangsAfterHeaders(w http.ResponseWriter, r *http.Request, body []byte) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

func TestHungDecodeIsRetriedAfterTheFirstByteDeadline(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		hang       func(w http.ResponseWriter, r *http.Request, body []byte)
	}{
		{"a stream: no headers", `{"prompt":"x","stream":true}`, hangs},
		{"a stream: headers but no first byte", `{"prompt":"x","stream":true}`, hangsAfterHeaders},
		// An answer that comes whole gets 1s per max_tokens more.
		{"an answer that comes whole", `{"prompt":"x","max_tokens":1}`, hangs},
	} {
		t.Run(tt.name, func(t *testing.T) {
			inBubble(t, func(t *testing.T, mem *testutil.MemNet, client *http.Client) {
				pre := newFakeOn(t, mem, prefillOK)
				decodes, first := firstThenOn(t, mem, tt.hang, decodeJSON)
				p, url := startProxyOn(t, mem, Config{Fallback: true, ScrapeInterval: -1, FirstByteTimeout: testFirstByte}, []*fakeEngine{pre}, decodes)
				start := time.Now()
				resp, body := postWith(t, client, url, "/v1/completions", tt.body, nil)
				took := time.Since(start)
				if resp.StatusCode != http.StatusOK || !strings.Contains(body, "hello") {
					t.Fatalf("answer %d %s; want the retry's 200", resp.StatusCode, body)
				}
				checkCutAt(t, took, testFirstByte)
				// The hung decode had the leg: its params may be spent.
				if got, want := resp.Header.Get(HeaderPD), "fallback; reason="+reasonDecodeRetry; got != want {
					t.Errorf("%s = %q, want %q", HeaderPD, got, want)
				}
				if backendOf(t, p, decodes[first.Load()]).healthy.Load() {
					t.Error("the hung decode is still marked healthy")
				}
				if n := metricValue(t, p, "tandem:proxy_leg_retries_total", map[string]string{"role": roleDecode, "reason": decodeTimeout}); n != 1 {
					t.Errorf("leg_retries_total{decode, %s} = %v, want 1", decodeTimeout, n)
				}
			})
		})
	}
}

func TestHungDecodeWithoutRetryAnswers504(t *testing.T) {
	inBubble(t, func(t *testing.T, mem *testutil.MemNet, client *http.Client) {
		pre := newFakeOn(t, mem, func(w http.ResponseWriter, r *http.Request, body []byte) {
			if r.URL.Path == kvReleasePath {
				io.WriteString(w, `{"released":true}`)
				return
			}
			prefillOK(w, r, body)
		})
		dec := newFakeOn(t, mem, hangs)
		p, url := startProxyOn(t, mem, Config{Fallback: true, ScrapeInterval: -1, FirstByteTimeout: testFirstByte, DecodeRetries: -1}, []*fakeEngine{pre}, []*fakeEngine{dec})
		start := time.Now()
		resp, body := postWith(t, client, url, "/v1/completions", `{"prompt":"x","stream":true}`, nil)
		if resp.StatusCode != http.StatusGatewayTimeout {
			t.Fatalf("answer %d %s, want 504", resp.StatusCode, body)
		}
		checkOpenAIError(t, body, http.StatusGatewayTimeout)
		checkCutAt(t, time.Since(start), testFirstByte)
		waitFor(t, func() bool {
			return metricValue(t, p, "tandem:proxy_kv_releases_total", map[string]string{"reason": releaseDecodeTimeout, "result": releaseOK}) == 1
		})
	})
}

func TestHungPrefillIsRetriedAfterTheFirstByteDeadline(t *testing.T) {
	inBubble(t, func(t *testing.T, mem *testutil.MemNet, client *http.Client) {
		prefills, _ := firstThenOn(t, mem, hangs, prefillOK)
		dec := newFakeOn(t, mem, decodeJSON)
		p, url := startProxyOn(t, mem, Config{Fallback: true, ScrapeInterval: -1, FirstByteTimeout: testFirstByte}, prefills, []*fakeEngine{dec})
		start := time.Now()
		resp, body := postWith(t, client, url, "/v1/completions", `{"prompt":"x"}`, nil)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderPD) != "remote" {
			t.Fatalf("answer %d %s %q; want 200 on the remote path through the other prefill", resp.StatusCode, body, resp.Header.Get(HeaderPD))
		}
		checkCutAt(t, time.Since(start), testFirstByte)
		if n := metricValue(t, p, "tandem:proxy_leg_retries_total", map[string]string{"role": rolePrefill, "reason": reasonTimeout}); n != 1 {
			t.Errorf("leg_retries_total{prefill, %s} = %v, want 1", reasonTimeout, n)
		}
	})
}

func TestStalledStreamIsCutAfterTheStallDeadline(t *testing.T) {
	inBubble(t, func(t *testing.T, mem *testutil.MemNet, client *http.Client) {
		pre := newFakeOn(t, mem, prefillOK)
		dec := newFakeOn(t, mem, func(w http.ResponseWriter, r *http.Request, body []byte) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"choices\":[{\"text\":\"hel\"}]}\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done() // stalled mid-stream
		})
		p, url := startProxyOn(t, mem, Config{Fallback: true, ScrapeInterval: -1, StallTimeout: testStall}, []*fakeEngine{pre}, []*fakeEngine{dec})
		start := time.Now()
		resp, err := client.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","stream":true}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		rd := bufio.NewReader(resp.Body)
		if line, err := rd.ReadString('\n'); err != nil || !strings.Contains(line, "hel") {
			t.Fatalf("first line %q, %v", line, err)
		}
		if rest, err := io.ReadAll(rd); err == nil {
			t.Errorf("the stalled stream ended cleanly after %q; the client must see it cut", rest)
		}
		checkCutAt(t, time.Since(start), testStall)
		waitFor(t, func() bool {
			return metricValue(t, p, "tandem:proxy_requests_total", map[string]string{"outcome": outcomeStreamBroken}) == 1
		})
	})
}

// TestNonStreamingDecodeFirstByteDeadline: an answer that comes whole has
// its generation's time on top of the first-byte deadline, within Timeout.
func TestNonStreamingDecodeFirstByteDeadline(t *testing.T) {
	p := &Proxy{cfg: Config{Timeout: 5 * time.Minute, FirstByteTimeout: time.Minute}}
	for _, tt := range []struct {
		stream    bool
		maxTokens int
		want      time.Duration
	}{
		{true, 1000, time.Minute},
		{false, 16, time.Minute + 16*time.Second},
		{false, 1000, 5 * time.Minute},
	} {
		if got := p.firstByteDeadline(&decodeLeg{stream: tt.stream}, &router.Request{MaxTokens: tt.maxTokens}); got != tt.want {
			t.Errorf("stream %v, max_tokens %d: %v, want %v", tt.stream, tt.maxTokens, got, tt.want)
		}
	}
}

// TestDeadlinesDefaultAndCap: the deadlines default as documented, and
// Timeout caps them.
func TestDeadlinesDefaultAndCap(t *testing.T) {
	c := Config{}
	c.setDefaults()
	if c.FirstByteTimeout != defaultFirstByteTimeout || c.StallTimeout != defaultStallTimeout || c.CanceledPrefillGrace != defaultCanceledPrefillGrace {
		t.Errorf("defaults %v %v %v", c.FirstByteTimeout, c.StallTimeout, c.CanceledPrefillGrace)
	}
	c = Config{Timeout: time.Second, FirstByteTimeout: time.Hour, StallTimeout: time.Hour}
	c.setDefaults()
	if c.FirstByteTimeout != time.Second || c.StallTimeout != time.Second {
		t.Errorf("with Timeout 1s: first byte %v, stall %v; want both capped at 1s", c.FirstByteTimeout, c.StallTimeout)
	}
}
