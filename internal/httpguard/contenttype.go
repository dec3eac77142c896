package httpguard

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/tandem-serve/tandem/internal/apierror"
)

// maxQuotedContentType bounds how much of a refused Content-Type the error
// message repeats.
const maxQuotedContentType = 100

// IsJSON reports whether a Content-Type value names application/json: the
// media type before any ";" parameters, spaces trimmed, case ignored, as
// vLLM compares it ("application/json; charset=utf-8" is JSON,
// "application/vnd.api+json" and "text/plain" are not).
func IsJSON(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/json")
}

// CheckContentType returns nil when h has exactly one Content-Type and it
// IsJSON, else a 415 whose message begins with vLLM's words for it.
func CheckContentType(h http.Header) *apierror.Error {
	cts := h.Values("Content-Type")
	if len(cts) == 1 && IsJSON(cts[0]) {
		return nil
	}
	got := "none"
	switch {
	case len(cts) > 1:
		got = "several Content-Type headers"
	case len(cts) == 1:
		ct := cts[0]
		if len(ct) > maxQuotedContentType {
			ct = ct[:maxQuotedContentType] + "..."
		}
		got = strconv.Quote(ct)
	}
	return apierror.NewError(http.StatusUnsupportedMediaType, "",
		"Unsupported Media Type: Only 'application/json' is allowed (got %s); send the JSON body with the header Content-Type: application/json", got)
}
