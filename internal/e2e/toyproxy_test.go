package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"testing"

	"github.com/google/uuid"

	"github.com/tandem-serve/tandem/internal/testmodels"
)

// toyProxy is what vLLM's toy proxy (tests/v1/kv_connector/nixl_integration/
// toy_proxy_server.py) does with one client request, step by step (see
// docs/kv-transfer.md, "Prefill leg" and "Decode leg"): a fresh
// uuid as X-Request-Id for both legs and "Authorization: Bearer
// $OPENAI_API_KEY" on both; the prefill leg is the client's body with
// kv_transfer_params {"do_remote_decode": true, the rest false or null},
// stream false, max_tokens (and max_completion_tokens, if present) 1,
// stream_options, min_tokens and min_completion_tokens removed; a non-2xx
// answer ends the request (raise_for_status); the decode leg is the
// client's body unchanged plus the prefill answer's kv_transfer_params
// verbatim, when it has any; the decode's bytes go back to the client as
// they are.
func toyProxy(prefill, decode, api string, reqData map[string]any) (reply, error) {
	requestID := uuid.NewString()
	headers := http.Header{
		// Python's f-string makes "Bearer None" of an unset variable.
		"Authorization": {"Bearer " + envOr("OPENAI_API_KEY", "None")},
		"X-Request-Id":  {requestID},
	}
	p := clone(reqData)
	p["kv_transfer_params"] = map[string]any{
		"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil,
	}
	p["stream"] = false
	p["max_tokens"] = 1
	if _, ok := p["max_completion_tokens"]; ok {
		p["max_completion_tokens"] = 1
	}
	for _, k := range []string{"stream_options", "min_tokens", "min_completion_tokens"} {
		delete(p, k)
	}
	pr, err := post(prefill+api, p, headers)
	if err != nil {
		return reply{}, err
	}
	if pr.status/100 != 2 {
		return pr, fmt.Errorf("prefill leg: HTTP %d: %s", pr.status, pr.body)
	}
	var responseJSON map[string]any
	if err := json.Unmarshal(pr.body, &responseJSON); err != nil {
		return pr, fmt.Errorf("prefill leg: %w", err)
	}
	d := clone(reqData)
	if kv, _ := responseJSON["kv_transfer_params"].(map[string]any); len(kv) > 0 {
		d["kv_transfer_params"] = kv
	}
	return post(decode+api, d, headers)
}

func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok {
		return v
	}
	return def
}

// post sends body as JSON to url with headers h.
func post(url string, body any, h http.Header) (reply, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return reply{}, err
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return reply{}, err
	}
	req.Header = h.Clone()
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: rb}, nil
}

// TestVLLMToyProxyDrivesTandemEngines runs a real prefill and decode
// engine, both with an API key and the cluster's KV secret (so the
// prefill signs its kv_transfer_params and the decode verifies them), and
// drives them exactly as vLLM's toy proxy does: its answers must be the
// colocated engine's, with the prompt's KV pulled from the prefill.
func TestVLLMToyProxyDrivesTandemEngines(t *testing.T) {
	model := testmodels.Stories260K(t)
	requirePD(t, tandem(t), "--api-key")
	const key, vocab = "toy-proxy-test-key", 512
	withKey := append([]string{"TANDEM_API_KEY=" + key}, withSecret...)

	ref := startEngine(t, engineSpec{name: "reference", model: model, env: noSecret})
	prefill := startEngine(t, engineSpec{name: "prefill", model: model, role: "prefill", env: withKey})
	decode := startEngine(t, engineSpec{name: "decode", model: model, role: "decode", env: withKey})

	t.Run("without OPENAI_API_KEY the engines refuse the toy proxy", func(t *testing.T) {
		t.Setenv("OPENAI_API_KEY", "") // restores the test's own value afterwards
		os.Unsetenv("OPENAI_API_KEY")
		r, err := toyProxy(prefill.url, decode.url, "/v1/completions", completionBody(tokenPrompt(50000, 20, vocab), samplings[0], false))
		if err == nil || r.status != http.StatusUnauthorized {
			t.Errorf("status %d, err %v; want the prefill leg refused with 401", r.status, err)
		}
	})

	t.Setenv("OPENAI_API_KEY", key)
	cases := []struct {
		name string
		body map[string]any
	}{
		{"a text prompt, greedy, not streamed",
			completionBody("Once upon a time, there was a little girl named Lily. She loved to play outside in the park.", samplings[0], false)},
		{"a token prompt of several blocks, seeded, streamed",
			completionBody(tokenPrompt(50001, 3*blockSize+5, vocab), samplings[1], true)},
		{"a token prompt with min_tokens (kept for the decode leg only), greedy, streamed",
			func() map[string]any {
				b := completionBody(tokenPrompt(50002, 2*blockSize, vocab), samplings[0], true)
				b["min_tokens"] = 4
				return b
			}()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want, _ := generate(t, ref.url, "/v1/completions", c.body)
			before := decodeCounters(t, decode)
			r, err := toyProxy(prefill.url, decode.url, "/v1/completions", clone(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if r.status != http.StatusOK {
				t.Fatalf("decode leg: status %d: %s", r.status, r.body)
			}
			var got generation
			if s, _ := c.body["stream"].(bool); s {
				got, err = parseStream(r.body)
			} else {
				got, err = parseResponse(r.body)
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, tail(string(r.body), 2000))
			}
			sameGeneration(t, want, got)
			checkPulled(t, decodeCounters(t, decode).sub(before), want.PromptTokens, 0)
		})
	}
	waitPoolsIdle(t, ref, prefill, decode)
}
