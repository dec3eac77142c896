package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// headerServerTiming is the W3C Server-Timing response header. The decode
// engine's answer carries its own entries (api, queue, kv_pull, prefill:
// where the engine's part of the time to first token went); the proxy keeps
// them and appends, in milliseconds:
//
//   - prefill_leg: the prefill leg as the proxy saw it, from sending it to
//     its whole answer (the prefill engine's queue and prefill, and the
//     HTTP round trip), retries included; absent on the local path;
//   - proxy: the rest of the proxy's time before the decode leg was sent
//     (reading and parsing the body, routing, waiting for admission, and
//     decode attempts that failed before their first byte).
//
// Together with the client's TTFT they give llm-d's "true TTFT" spans per
// request: what is left is the decode leg's network and relay.
const headerServerTiming = "Server-Timing"

// timingEntry formats one Server-Timing metric, "name;dur=ms".
func timingEntry(name string, d time.Duration) string {
	return name + ";dur=" + strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

// addTiming appends the proxy's Server-Timing entries for leg, whose decode
// request was sent at decodeSent, to h (the decode's headers, copied), as
// one header line.
func addTiming(h http.Header, leg *decodeLeg, decodeSent time.Time) {
	if leg.arrived.IsZero() {
		return
	}
	entries := h.Values(headerServerTiming)
	if leg.prefill > 0 {
		entries = append(entries, timingEntry("prefill_leg", leg.prefill))
	}
	entries = append(entries, timingEntry("proxy", max(decodeSent.Sub(leg.arrived)-leg.prefill, 0)))
	h.Set(headerServerTiming, strings.Join(entries, ", "))
}

// engineTiming is what an engine's answer says in Server-Timing of where its
// part of the time to first token went (see package openai's
// HeaderServerTiming): queue, the KV pull and the wait after it (kv_pull,
// kv_ready, zero when nothing was pulled), and prefill, the compute from
// then to the first token. ok is false when the answer carries no prefill
// entry (an engine that sends no Server-Timing, or another server's).
type engineTiming struct {
	queue, pull, ready, prefill time.Duration
	ok                          bool
}

// maxTimingMillis is the longest Server-Timing duration taken from an
// engine (an hour): a longer one, or one that is not a number, is skipped
// rather than let one answer skew the engine's measured costs.
const maxTimingMillis = 3.6e6

// parseEngineTiming reads an engine answer's Server-Timing entries. Entries
// it does not know, and malformed ones, are skipped.
func parseEngineTiming(h http.Header) (t engineTiming) {
	for _, line := range h.Values(headerServerTiming) {
		for entry := range strings.SplitSeq(line, ",") {
			name, params, _ := strings.Cut(strings.TrimSpace(entry), ";")
			var dur time.Duration
			found := false
			for p := range strings.SplitSeq(params, ";") {
				k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
				if k != "dur" {
					continue
				}
				ms, err := strconv.ParseFloat(strings.Trim(v, `"`), 64)
				if err != nil || !(ms >= 0 && ms <= maxTimingMillis) { // NaN, ±Inf and absurd values too
					break
				}
				dur, found = time.Duration(ms*float64(time.Millisecond)), true
			}
			if !found {
				continue
			}
			switch name {
			case "queue":
				t.queue = dur
			case "kv_pull":
				t.pull = dur
			case "kv_ready":
				t.ready = dur
			case "prefill":
				t.prefill, t.ok = dur, true
			}
		}
	}
	return t
}
