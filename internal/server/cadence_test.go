package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/server"
	"github.com/tandem-serve/tandem/internal/server/servertest"
	"github.com/tandem-serve/tandem/internal/sim"
)

// do sends method url with body (as JSON when contentType is "") and the
// bearer key, and returns the status and the body.
func do(t *testing.T, method, url, key, contentType, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType == "" {
		contentType = "application/json"
	}
	req.Header.Set("Content-Type", contentType)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestCadenceRoute sets an engine's prefill cadence at run time through
// its admin route: only with the API key, only in range, with
// OpenAI-shaped errors, and /metrics follows.
func TestCadenceRoute(t *testing.T) {
	cfg := simConfig(t, sim.Knobs{TTFT: 2 * time.Millisecond, ITL: time.Millisecond})
	cfg.APIKey = "sesame"
	s := servertest.Start(t, cfg)
	url := "http://" + s.Addr() + server.CadencePath

	if code, body := do(t, http.MethodPost, url, "", "", `{"prefill_schedule_interval":4}`); code != http.StatusUnauthorized || !strings.Contains(body, `"error"`) {
		t.Fatalf("POST without the key: %d %s, want an OpenAI-shaped 401", code, body)
	}
	if code, _ := do(t, http.MethodGet, url, "wrong", "", ""); code != http.StatusUnauthorized {
		t.Fatalf("GET with a wrong key: %d, want 401", code)
	}
	code, body := do(t, http.MethodGet, url, "sesame", "", "")
	var got server.CadenceResponse
	if code != http.StatusOK || json.Unmarshal([]byte(body), &got) != nil || got.PrefillScheduleInterval != 1 || got.Max != 64 {
		t.Fatalf("GET: %d %s, want 200 with interval 1 and max 64", code, body)
	}
	code, body = do(t, http.MethodPost, url, "sesame", "", `{"prefill_schedule_interval":4}`)
	got = server.CadenceResponse{}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &got) != nil || got.PrefillScheduleInterval != 4 || got.Previous != 1 {
		t.Fatalf("POST 4: %d %s, want 200 with interval 4 and previous 1", code, body)
	}

	bad := []struct {
		name, contentType, body string
		status                  int
		says                    string
	}{
		{"zero", "", `{"prefill_schedule_interval":0}`, 400, "out of range"},
		{"negative", "", `{"prefill_schedule_interval":-3}`, 400, "out of range"},
		{"over the bound", "", `{"prefill_schedule_interval":65}`, 400, "out of range"},
		{"a fraction", "", `{"prefill_schedule_interval":2.5}`, 400, "an integer from 1 to 64"},
		{"a string", "", `{"prefill_schedule_interval":"4"}`, 400, "an integer from 1 to 64"},
		{"missing", "", `{}`, 400, "is required"},
		{"an unknown field", "", `{"prefill_schedule_interval":2,"interval":3}`, 400, "unknown field"},
		{"two values", "", `{"prefill_schedule_interval":2}{"prefill_schedule_interval":3}`, 400, "more than one"},
		{"not JSON", "text/plain", `4`, 415, ""},
		{"too big", "", `{"prefill_schedule_interval":2,"pad":"` + strings.Repeat("x", 5000) + `"}`, 413, "over"},
	}
	for _, c := range bad {
		t.Run("refuses "+c.name, func(t *testing.T) {
			code, body := do(t, http.MethodPost, url, "sesame", c.contentType, c.body)
			var e struct {
				Error struct {
					Message, Type string
					Param         *string
				}
			}
			if code != c.status || json.Unmarshal([]byte(body), &e) != nil || e.Error.Type == "" || !strings.Contains(e.Error.Message, c.says) {
				t.Errorf("%d %s, want an OpenAI-shaped %d saying %q", code, body, c.status, c.says)
			}
		})
	}
	if code, _ := do(t, http.MethodPut, url, "sesame", "", `{"prefill_schedule_interval":2}`); code != http.StatusMethodNotAllowed {
		t.Errorf("PUT: %d, want 405", code)
	}

	code, body = do(t, http.MethodGet, "http://"+s.Addr()+"/metrics", "", "", "")
	if code != http.StatusOK || !metricLine(body, "tandem:prefill_schedule_interval", "4") {
		t.Errorf("/metrics after the refusals: %d, want tandem:prefill_schedule_interval 4 still:\n%s", code, grepLines(body, "prefill_schedule_interval"))
	}
}

// TestCadenceRouteWithoutAPIKeyServesLoopback: an engine without a key
// (`tandem up`'s) takes the change from its own host.
func TestCadenceRouteWithoutAPIKeyServesLoopback(t *testing.T) {
	s := servertest.Start(t, simConfig(t, sim.Knobs{TTFT: 2 * time.Millisecond, ITL: time.Millisecond}))
	url := "http://" + s.Addr() + server.CadencePath
	if code, body := do(t, http.MethodPost, url, "", "", `{"prefill_schedule_interval":3}`); code != http.StatusOK || !strings.Contains(body, `"prefill_schedule_interval":3`) {
		t.Fatalf("POST from loopback without a key: %d %s, want 200", code, body)
	}
}

func metricLine(body, name, value string) bool {
	for l := range strings.SplitSeq(body, "\n") {
		if strings.HasPrefix(l, name+"{") && strings.HasSuffix(l, " "+value) {
			return true
		}
	}
	return false
}

func grepLines(body, s string) string {
	var out []string
	for l := range strings.SplitSeq(body, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
