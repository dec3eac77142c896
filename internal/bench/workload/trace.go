package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// TraceOptions shape a trace replay.
type TraceOptions struct {
	// BlockTokens is the number of tokens one prefix hash id stands for
	// (Mooncake's traces use 512). Default 512.
	BlockTokens int
	// Speed scales time: 2 replays the trace twice as fast. Default 1.
	Speed float64
	// Limit keeps only the first Limit requests; 0 keeps all.
	Limit int
}

// traceLine is one request of a Mooncake-style JSONL trace:
//
//	{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}
//
// timestamp is in milliseconds (a number) or a date-time string as in the
// Azure LLM inference traces ("2023-11-16 18:15:46.6805900"); the Azure
// column names ContextTokens and GeneratedTokens (any case, with or without
// an underscore) are accepted for the lengths.
type traceLine struct {
	Timestamp json.RawMessage `json:"timestamp"`
	Input     *int            `json:"input_length"`
	Output    *int            `json:"output_length"`
	Context   *int            `json:"context_tokens"`
	Generated *int            `json:"generated_tokens"`
	HashIDs   []int64         `json:"hash_ids"`
}

// ReadTrace reads a JSONL trace (one JSON object per line; blank lines are
// skipped) into a workload with the trace's arrival times. Requests that
// share leading hash ids share those blocks of prompt tokens, so a server's
// prefix cache sees the trace's sharing. name (the file name) prefixes
// every error with its line number.
func ReadTrace(r io.Reader, name string, opts TraceOptions, seed uint64, pool []int32) (*Workload, error) {
	if opts.BlockTokens == 0 {
		opts.BlockTokens = 512
	}
	if opts.Speed == 0 {
		opts.Speed = 1
	}
	if opts.BlockTokens < 1 || opts.Speed < 0 || math.IsInf(opts.Speed, 0) || math.IsNaN(opts.Speed) {
		return nil, fmt.Errorf("trace %s: block tokens %d and speed %v: want positive values", name, opts.BlockTokens, opts.Speed)
	}
	if len(pool) == 0 {
		return nil, errors.New("trace: empty token pool")
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	w := &Workload{Name: "trace:" + name, TimedArrivals: true}
	blocks := map[int64][]int32{}
	rnd := newRand(seed, "trace:"+name)
	var first, last float64
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		fail := func(format string, args ...any) error {
			return fmt.Errorf("trace %s line %d: %s", name, lineNo, fmt.Sprintf(format, args...))
		}
		var tl traceLine
		dec := json.NewDecoder(bytes.NewReader(normalizeKeys(line)))
		if err := dec.Decode(&tl); err != nil {
			return nil, fail("not a JSON object (%v): %.80q", err, line)
		}
		in, out := tl.Input, tl.Output
		if in == nil {
			in = tl.Context
		}
		if out == nil {
			out = tl.Generated
		}
		switch {
		case in == nil || out == nil:
			return nil, fail("needs input_length and output_length (or ContextTokens and GeneratedTokens)")
		case *in < 1 || *out < 1:
			return nil, fail("input_length %d and output_length %d must be at least 1", *in, *out)
		case len(tl.HashIDs)*opts.BlockTokens >= *in+opts.BlockTokens:
			return nil, fail("%d hash_ids of %d tokens are more than input_length %d needs: is --trace-block right?", len(tl.HashIDs), opts.BlockTokens, *in)
		}
		ts, err := parseTimestamp(tl.Timestamp)
		if err != nil {
			return nil, fail("%v", err)
		}
		if len(w.Conversations) == 0 {
			first = ts
		} else if ts < last {
			return nil, fail("timestamp %v is before the previous line's %v: the trace must be in time order", ts, last)
		}
		last = ts
		prompt := make([]int32, 0, *in)
		for _, h := range tl.HashIDs {
			b, ok := blocks[h]
			if !ok {
				b = tokens(newRand(seed, fmt.Sprintf("block:%d", h)), opts.BlockTokens, pool)
				blocks[h] = b
			}
			prompt = append(prompt, b[:min(len(b), *in-len(prompt))]...)
		}
		prompt = append(prompt, tokens(rnd, *in-len(prompt), pool)...)
		c := single(prompt, *out, -1)
		c.Arrival = time.Duration((ts - first) / opts.Speed * float64(time.Millisecond))
		w.Conversations = append(w.Conversations, c)
		if opts.Limit > 0 && len(w.Conversations) == opts.Limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace %s after line %d: %w", name, lineNo, err)
	}
	if len(w.Conversations) == 0 {
		return nil, fmt.Errorf("trace %s has no requests", name)
	}
	return w, nil
}

// normalizeKeys maps the Azure trace's column names to the JSON keys
// traceLine reads, whatever their case.
func normalizeKeys(line []byte) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(line, &m) != nil {
		return line // the decoder reports the error
	}
	out := make(map[string]json.RawMessage, len(m))
	for k, v := range m {
		switch strings.ReplaceAll(strings.ToLower(k), "_", "") {
		case "timestamp":
			k = "timestamp"
		case "contexttokens":
			k = "context_tokens"
		case "generatedtokens":
			k = "generated_tokens"
		case "inputlength":
			k = "input_length"
		case "outputlength":
			k = "output_length"
		case "hashids":
			k = "hash_ids"
		}
		out[k] = v
	}
	b, _ := json.Marshal(out)
	return b
}

var timeLayouts = []string{time.RFC3339Nano, "2006-01-02 15:04:05.9999999", "2006-01-02 15:04:05"}

// parseTimestamp returns a line's time in milliseconds.
func parseTimestamp(raw json.RawMessage) (float64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, errors.New("needs a timestamp (milliseconds, or a date-time string)")
	}
	var ms float64
	if err := json.Unmarshal(raw, &ms); err == nil {
		if ms < 0 || math.IsInf(ms, 0) {
			return 0, fmt.Errorf("timestamp %v must be a non-negative number of milliseconds", ms)
		}
		return ms, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return 0, fmt.Errorf("timestamp %s is neither a number nor a string", raw)
	}
	for _, l := range timeLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return float64(t.UnixNano()) / 1e6, nil
		}
	}
	return 0, fmt.Errorf("timestamp %q: want milliseconds or a date-time like 2023-11-16 18:15:46.6805900", s)
}
