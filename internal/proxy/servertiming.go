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
