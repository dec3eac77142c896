package bench

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tandem-serve/tandem/internal/testutil"
)

func readAll(r *SSEReader) ([]string, error) {
	var out []string
	for {
		d, err := r.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, string(d))
	}
}

func TestSSEReader(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		want   []string
	}{
		{"vLLM-style events", "data: {\"a\":1}\n\ndata: [DONE]\n\n", []string{`{"a":1}`, "[DONE]"}},
		{"CRLF line endings", "data: x\r\n\r\ndata: y\r\n\r\n", []string{"x", "y"}},
		{"lone CR line endings", "data: x\r\rdata: y\r\r", []string{"x", "y"}},
		{"no space after the colon", "data:x\n\n", []string{"x"}},
		{"only one leading space is removed", "data:  x\n\n", []string{" x"}},
		{"multi-line data joined by newlines", "data: a\ndata: b\n\n", []string{"a\nb"}},
		{"comments and other fields are ignored", ": ping\nevent: message\nid: 3\nretry: 10\ndata: x\n\n", []string{"x"}},
		{"events without data are skipped", "event: noop\n\n\n\ndata: x\n\n", []string{"x"}},
		{"a field name alone has an empty value", "data\n\n", []string{""}},
		{"an event cut off by EOF is dropped", "data: x\n\ndata: partial", []string{"x"}},
		{"a final event without its blank line is dropped", "data: x\n\ndata: y\n", []string{"x"}},
		{"empty stream", "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range []struct {
				name string
				r    io.Reader
			}{
				{"whole", strings.NewReader(tc.stream)},
				{"one byte at a time", iotest.OneByteReader(strings.NewReader(tc.stream))},
			} {
				got, err := readAll(NewSSEReader(r.r))
				if err != nil {
					t.Fatalf("%s: %v", r.name, err)
				}
				if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("%s: events (-want +got):\n%s", r.name, diff)
				}
			}
		})
	}
}

func TestSSEReaderRejectsHugeEvents(t *testing.T) {
	line := "data: " + strings.Repeat("x", MaxEventSize/2) + "\n"
	_, err := readAll(NewSSEReader(strings.NewReader(line + line + line + "\n")))
	if !errors.Is(err, ErrEventTooLarge) {
		t.Errorf("err = %v, want ErrEventTooLarge", err)
	}
	_, err = readAll(NewSSEReader(strings.NewReader("data: " + strings.Repeat("x", MaxEventSize+1) + "\n\n")))
	if !errors.Is(err, ErrEventTooLarge) {
		t.Errorf("one long line: err = %v, want ErrEventTooLarge", err)
	}
}

// FuzzSSEReader checks that the parser never panics and that how the bytes
// are split into reads never changes the events.
func FuzzSSEReader(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: a\r\ndata: b\r\r\n: c\nevent: x\n\n"))
	f.Add([]byte("data\n\ndata:\rdata: \r\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		whole, err1 := readAll(NewSSEReader(bytes.NewReader(b)))
		bytewise, err2 := readAll(NewSSEReader(iotest.OneByteReader(bytes.NewReader(b))))
		if (err1 == nil) != (err2 == nil) || !cmp.Equal(whole, bytewise) {
			t.Fatalf("whole read %q (%v) but byte-wise %q (%v)", whole, err1, bytewise, err2)
		}
	})
}

func chunk(text string, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return `data: {"choices":[{"index":0,"text":"` + text + `","finish_reason":` + f + "}]}\n\n"
}

func TestMeasureStream(t *testing.T) {
	usage := "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":4}}\n\n"
	done := "data: [DONE]\n\n"
	ms := time.Millisecond
	tests := []struct {
		name    string
		stream  string
		want    Outcome
		wantErr string
	}{
		{
			"tokens, usage and done; the clock ticks 1ms per reading",
			chunk("a", "") + chunk("", "") + chunk("b", "") + chunk("c", "length") + usage + done,
			Outcome{TTFT: 1 * ms, E2E: 7 * ms, ITL: []time.Duration{ms, ms, ms}, PromptTokens: 5, OutputTokens: 4, Text: "abc"},
			"",
		},
		{
			"a finish-only chunk is not a token; without usage tokens are counted",
			chunk("a", "") + chunk("b", "") + chunk("", "stop") + done,
			Outcome{TTFT: 1 * ms, E2E: 5 * ms, ITL: []time.Duration{ms}, OutputTokens: 2, Text: "ab"},
			"",
		},
		{"no [DONE] is a failure", chunk("a", ""), Outcome{}, "stream ended before [DONE]"},
		{"an error event is a failure", chunk("a", "") + "data: {\"error\":{\"message\":\"boom\"}}\n\n", Outcome{}, "server error in stream: boom"},
		{"bad JSON is a failure", "data: {nope\n\n", Outcome{}, "bad stream chunk"},
		{"no tokens is a failure", done, Outcome{}, "stream carried no tokens"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := testutil.NewFakeClock(time.Unix(0, 0))
			clk.Step(ms)
			got := measureStream(strings.NewReader(tc.stream), time.Unix(0, 0), clk.Now)
			if tc.wantErr != "" {
				if got.Err == nil || !strings.Contains(got.Err.Error(), tc.wantErr) {
					t.Fatalf("Err = %v, want one containing %q", got.Err, tc.wantErr)
				}
				return
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty(), cmpopts.IgnoreFields(Outcome{}, "Err")); diff != "" || got.Err != nil {
				t.Errorf("Outcome (-want +got):\n%s\nErr: %v", diff, got.Err)
			}
		})
	}
}

func TestOutcomeTPOT(t *testing.T) {
	tests := []struct {
		o    Outcome
		want time.Duration
	}{
		{Outcome{TTFT: 100, E2E: 400, OutputTokens: 4}, 100},
		{Outcome{TTFT: 100, E2E: 100, OutputTokens: 1}, 0},
		{Outcome{}, 0},
	}
	for _, tc := range tests {
		if got := tc.o.TPOT(); got != tc.want {
			t.Errorf("TPOT(%+v) = %v, want %v", tc.o, got, tc.want)
		}
	}
}
