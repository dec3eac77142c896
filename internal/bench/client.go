package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Client talks to one OpenAI-compatible server.
type Client struct {
	// BaseURL is the server's root, for example "http://127.0.0.1:8000".
	BaseURL string
	// HTTP sends the requests; its Timeout should be zero because streaming
	// requests are bounded by their contexts instead.
	HTTP *http.Client
	// CallTimeout bounds the small calls (models, tokenize).
	CallTimeout time.Duration
	// APIKey, when set, is sent as Authorization: Bearer.
	APIKey string

	freshOnce sync.Once
	fresh     *http.Client
}

// NewClient returns a Client for baseURL whose connection pool keeps up to
// maxConns idle connections, so a run at that concurrency reuses them
// rather than measuring TCP handshakes.
func NewClient(baseURL string, maxConns int) *Client {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          max(maxConns, 100),
		MaxIdleConnsPerHost:   max(maxConns, 2),
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return &Client{
		BaseURL:     strings.TrimRight(baseURL, "/"),
		HTTP:        &http.Client{Transport: tr},
		CallTimeout: 30 * time.Second,
	}
}

// ModelInfo is one entry of /v1/models.
type ModelInfo struct {
	ID string `json:"id"`
	// MaxModelLen is vLLM's extension; 0 when the server does not say.
	MaxModelLen int `json:"max_model_len"`
}

// Models lists the served models.
func (c *Client) Models(ctx context.Context) ([]ModelInfo, error) {
	var out struct {
		Data []ModelInfo `json:"data"`
	}
	if err := c.call(ctx, http.MethodGet, "/v1/models", nil, &out); err != nil {
		return nil, err
	}
	return out.Data, nil
}

// Tokenize returns the token ids of text without special tokens, using
// vLLM's /tokenize endpoint.
func (c *Client) Tokenize(ctx context.Context, model, text string) ([]int32, error) {
	req := map[string]any{"model": model, "prompt": text, "add_special_tokens": false}
	var out struct {
		Tokens []int32 `json:"tokens"`
	}
	if err := c.call(ctx, http.MethodPost, "/tokenize", req, &out); err != nil {
		return nil, err
	}
	return out.Tokens, nil
}

func (c *Client) call(ctx context.Context, method, path string, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.CallTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err // a *url.Error, which names the method and URL
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %w", method, path, statusError(resp))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decoding the response: %w", method, path, err)
	}
	return nil
}

// statusError describes a non-200 response, with the OpenAI error message
// when the body carries one.
func statusError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	msg := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &e) == nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	return fmt.Errorf("HTTP %d: %s", resp.StatusCode, msg)
}

// Outcome is the measurement of one request. Durations are from just before
// the request was sent.
type Outcome struct {
	// TTFT is the time to the first chunk carrying a token.
	TTFT time.Duration
	// E2E is the time to the end of the stream.
	E2E time.Duration
	// ITL holds the gaps between consecutive token chunks.
	ITL []time.Duration
	// PromptTokens and OutputTokens come from the usage chunk when the
	// server sends one; OutputTokens otherwise counts token chunks.
	PromptTokens int
	OutputTokens int
	// PD is the x-tandem-pd response header ("remote", "fallback; reason=...")
	// or "" when the server sends none.
	PD string
	// Timing is the Server-Timing header's durations in milliseconds by
	// name (ParseServerTiming), nil without one.
	Timing map[string]float64
	// Text is the streamed text, kept for multi-turn conversations.
	Text string
	// Err is nil for a complete, successful stream.
	Err error
	// Resent reports that the request was sent a second time, on a fresh
	// connection, because the kept-alive connection it first went out on
	// turned out closed before any byte of an answer (Client.Stream).
	Resent bool
}

// TPOT is the mean time per output token after the first,
// (E2E - TTFT) / (OutputTokens - 1), or 0 for fewer than two tokens.
func (o *Outcome) TPOT() time.Duration {
	if o.OutputTokens < 2 {
		return 0
	}
	return (o.E2E - o.TTFT) / time.Duration(o.OutputTokens-1)
}

// CompletionRequest is the body of a benchmark request.
type CompletionRequest struct {
	Model         string         `json:"model"`
	Prompt        []int32        `json:"prompt"`
	MaxTokens     int            `json:"max_tokens"`
	Temperature   float64        `json:"temperature"`
	IgnoreEOS     bool           `json:"ignore_eos"`
	Stream        bool           `json:"stream"`
	StreamOptions map[string]any `json:"stream_options,omitempty"`
	// ConversationID names a multi-turn conversation, for servers that keep
	// its KV between turns (Tandem's proxy with --conversations).
	ConversationID string `json:"conversation_id,omitempty"`
}

// streamChunk is the part of a completion chunk the benchmark reads.
type streamChunk struct {
	Choices []struct {
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// errNoDone marks a stream that ended without "data: [DONE]".
var errNoDone = errors.New("stream ended before [DONE]")

// Stream sends req as a streaming completion and measures it. Failures are
// reported in Outcome.Err, never as a panic; ctx bounds the whole request.
func (c *Client) Stream(ctx context.Context, req CompletionRequest) Outcome {
	req.Stream = true
	req.StreamOptions = map[string]any{"include_usage": true}
	body, err := json.Marshal(req)
	if err != nil {
		return Outcome{Err: err}
	}
	start := time.Now()
	resp, reusedClosed, err := c.post(ctx, c.HTTP, body)
	resent := false
	if reusedClosed && ctx.Err() == nil {
		// The server had closed the kept-alive connection (an idle
		// timeout racing with this request) before answering anything:
		// the request never reached it, so it is sent again, once, on a
		// fresh connection. The clock restarts: the lost attempt measures
		// this client's connection pool, not the server.
		resent = true
		start = time.Now()
		resp, _, err = c.post(ctx, c.freshClient(), body)
	}
	if err != nil {
		return Outcome{Err: err, E2E: time.Since(start), Resent: resent}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Outcome{Err: statusError(resp), E2E: time.Since(start), Resent: resent}
	}
	o := measureStream(resp.Body, start, time.Now)
	o.Resent = resent
	o.PD = resp.Header.Get("X-Tandem-Pd")
	o.Timing = ParseServerTiming(resp.Header.Values("Server-Timing"))
	if o.Err != nil && ctx.Err() != nil {
		o.Err = fmt.Errorf("%w (%v)", ctx.Err(), o.Err)
	}
	return o
}

// measureStream reads an SSE completion stream that began at start, with
// now as the clock.
func measureStream(r io.Reader, start time.Time, now func() time.Time) Outcome {
	var o Outcome
	var last time.Time
	chunks := 0
	sse := NewSSEReader(r)
	for {
		data, err := sse.Next()
		if err == io.EOF {
			o.Err = errNoDone
			break
		}
		if err != nil {
			o.Err = err
			break
		}
		t := now()
		if string(bytes.TrimSpace(data)) == "[DONE]" {
			break
		}
		var ch streamChunk
		if err := json.Unmarshal(data, &ch); err != nil {
			o.Err = fmt.Errorf("bad stream chunk %.200q: %w", data, err)
			break
		}
		if ch.Error != nil {
			o.Err = fmt.Errorf("server error in stream: %s", ch.Error.Message)
			break
		}
		if ch.Usage != nil {
			o.PromptTokens, o.OutputTokens = ch.Usage.PromptTokens, ch.Usage.CompletionTokens
		}
		// A chunk carries a token when it has text or is not just the
		// finish notice (servers may stream empty text while a multi-byte
		// character is incomplete).
		if len(ch.Choices) == 0 || (ch.Choices[0].Text == "" && ch.Choices[0].FinishReason != nil) {
			continue
		}
		o.Text += ch.Choices[0].Text
		if chunks == 0 {
			o.TTFT = t.Sub(start)
		} else {
			o.ITL = append(o.ITL, t.Sub(last))
		}
		last = t
		chunks++
	}
	o.E2E = now().Sub(start)
	if o.OutputTokens == 0 {
		o.OutputTokens = chunks
	}
	if o.Err == nil && chunks == 0 {
		o.Err = errors.New("stream carried no tokens")
	}
	return o
}
