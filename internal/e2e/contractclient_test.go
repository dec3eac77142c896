package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// How a request of the contract test ended.
type ending int

const (
	endAnswer ending = 1 << iota // 200 with a whole answer (a stream to its [DONE], with a finish reason)
	endError                     // an OpenAI-shaped error body (or error event in a stream)
	endCut                       // a stream, or a 200 body, that started and was cut
	endClosed                    // the connection closed without an answer
	endGone                      // the client itself left
)

func (e ending) String() string {
	var s []string
	for i, n := range []string{"answer", "error", "cut", "closed", "client gone"} {
		if e&(1<<i) != 0 {
			s = append(s, n)
		}
	}
	return strings.Join(s, "|")
}

// outcome is how one request ended.
type outcome struct {
	end    ending
	status int
	pd     string // the proxy's x-tandem-pd
	detail string
	took   time.Duration
}

// send posts a completion request to url in the background, with
// contractDeadline as its deadline. first is closed when a stream's first
// data chunk has arrived; the outcome comes on result. A request whose
// client (ctx) left ends as endGone unless it had its whole answer.
func send(ctx context.Context, url string, body map[string]any) (first <-chan struct{}, result <-chan outcome) {
	fc := make(chan struct{})
	res := make(chan outcome, 1)
	go func() {
		start := time.Now()
		o := doSend(ctx, url, body, fc)
		o.took = time.Since(start)
		if ctx.Err() != nil && o.end != endAnswer {
			o.end, o.detail = endGone, "the client left: "+o.detail
		}
		res <- o
	}()
	return fc, res
}

func doSend(ctx context.Context, url string, body map[string]any, first chan struct{}) outcome {
	b, err := json.Marshal(body)
	if err != nil {
		return outcome{end: endClosed, detail: err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, contractDeadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		return outcome{end: endClosed, detail: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return outcome{end: endClosed, detail: err.Error()}
	}
	defer resp.Body.Close()
	o := outcome{status: resp.StatusCode, pd: resp.Header.Get("X-Tandem-Pd")}
	if resp.StatusCode != http.StatusOK {
		raw, err := io.ReadAll(resp.Body)
		if msg, ok := openAIError(raw); err == nil && ok {
			o.end, o.detail = endError, msg
			return o
		}
		o.end, o.detail = endClosed, fmt.Sprintf("not an OpenAI-shaped error: %q (%v)", raw, err)
		return o
	}
	type choice struct {
		FinishReason *string `json:"finish_reason"`
	}
	if body["stream"] != true {
		raw, err := io.ReadAll(resp.Body)
		var r struct{ Choices []choice }
		if err != nil || json.Unmarshal(raw, &r) != nil || len(r.Choices) != 1 || r.Choices[0].FinishReason == nil {
			o.end, o.detail = endCut, fmt.Sprintf("an incomplete answer %q (%v)", tail(string(raw), 200), err)
			return o
		}
		o.end = endAnswer
		return o
	}
	sc := bufio.NewScanner(resp.Body)
	chunks, finished := 0, false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			if !finished {
				o.end, o.detail = endCut, fmt.Sprintf("[DONE] after %d chunks without a finish reason", chunks)
				return o
			}
			o.end, o.detail = endAnswer, fmt.Sprintf("%d chunks", chunks)
			return o
		}
		if msg, ok := openAIError([]byte(data)); ok {
			o.end, o.detail = endError, "an error event after the stream began: "+msg
			return o
		}
		var ev struct{ Choices []choice }
		if json.Unmarshal([]byte(data), &ev) == nil {
			for _, c := range ev.Choices {
				finished = finished || c.FinishReason != nil
			}
		}
		if chunks++; chunks == 1 {
			close(first)
		}
	}
	o.end, o.detail = endCut, fmt.Sprintf("cut after %d chunks (%v)", chunks, sc.Err())
	return o
}

// openAIError is the message of an OpenAI-shaped error body (an "error"
// object with a message and a type).
func openAIError(raw []byte) (string, bool) {
	var e struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &e) != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		return "", false
	}
	return e.Error.Message, true
}
