package openai

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
)

// HeaderServerTiming is the W3C Server-Timing response header. A completion
// or chat answer carries, in milliseconds, where the engine's part of its
// time to first token went (engine.Timing):
//
//	Server-Timing: api;dur=0.310, queue;dur=1.204, kv_pull;dur=35.871, kv_ready;dur=0.412, prefill;dur=12.530
//
// api is the server's own time before the engine had the request (reading,
// validating and tokenizing it), queue the wait for admission, kv_pull the
// load of the prompt's KV from a prefill engine and kv_ready the wait from
// its end to the step that first ran the request (both present only when
// KV was loaded: queue, kv_pull and kv_ready are then the fetch's stages
// waiting_to_start, in_progress and completed_waiting), prefill the
// compute of the uncached prompt up to the first token. The P/D proxy
// appends its own entries (prefill_leg, proxy) to the decode engine's.
const HeaderServerTiming = "Server-Timing"

// ServerTimingEntry formats one Server-Timing metric, "name;dur=ms".
func ServerTimingEntry(name string, d time.Duration) string {
	return name + ";dur=" + strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 3, 64)
}

// formatTiming is t, after api, as a Server-Timing value.
func formatTiming(t *engine.Timing, api time.Duration) string {
	parts := []string{ServerTimingEntry("api", api), ServerTimingEntry("queue", t.Queue)}
	if t.KVLoad > 0 {
		parts = append(parts, ServerTimingEntry("kv_pull", t.KVLoad), ServerTimingEntry("kv_ready", t.KVReady))
	}
	parts = append(parts, ServerTimingEntry("prefill", t.Prefill))
	return strings.Join(parts, ", ")
}

// setTiming sets the Server-Timing header from t, once, while the headers
// are not written yet (the first token's event carries t; with n > 1 the
// first choice's is the answer's).
func setTiming(h http.Header, t *engine.Timing, api time.Duration) {
	if t != nil && h.Get(HeaderServerTiming) == "" {
		h.Set(HeaderServerTiming, formatTiming(t, api))
	}
}
