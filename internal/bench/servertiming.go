package bench

import (
	"math"
	"strconv"
	"strings"
)

// ParseServerTiming reads the durations of Server-Timing header values
// (W3C Server Timing: `name;dur=ms;desc="..."`, entries separated by
// commas, in one header line or several), in milliseconds by metric name.
// The engines send api, queue, kv_pull and prefill, the P/D proxy
// prefill_leg and proxy (see openai.HeaderServerTiming). A name given twice
// adds up; entries without a valid dur, with a name that is not a token,
// or with a negative or non-finite dur are skipped, so that a server's
// malformed header costs its numbers, never the request. Nil when nothing
// was read.
func ParseServerTiming(values []string) map[string]float64 {
	var out map[string]float64
	for _, v := range values {
		for _, entry := range splitUnquoted(v, ',') {
			params := splitUnquoted(entry, ';')
			name := strings.TrimSpace(params[0])
			if !isToken(name) {
				continue
			}
			for _, p := range params[1:] {
				k, val, ok := strings.Cut(p, "=")
				if !ok || !strings.EqualFold(strings.TrimSpace(k), "dur") {
					continue
				}
				d, err := strconv.ParseFloat(strings.Trim(strings.TrimSpace(val), `"`), 64)
				if err != nil || d < 0 || math.IsInf(d, 0) || math.IsNaN(d) {
					break
				}
				if out == nil {
					out = map[string]float64{}
				}
				if out[name] += d; math.IsInf(out[name], 0) {
					out[name] = math.MaxFloat64 // JSON has no infinity
				}
				break // the first dur counts, as browsers read it
			}
		}
	}
	return out
}

// splitUnquoted splits s at sep outside double-quoted strings (which may
// escape a quote with a backslash).
func splitUnquoted(s string, sep byte) []string {
	var parts []string
	quoted, escaped, from := false, false, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case escaped:
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			parts = append(parts, s[from:i])
			from = i + 1
		}
	}
	return append(parts, s[from:])
}

// isToken says whether s is an HTTP token (RFC 9110 tchar+).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
