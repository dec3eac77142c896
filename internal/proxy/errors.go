package proxy

import (
	"encoding/json"
	"net/http"
)

// Error types, as OpenAI and vLLM spell them.
const (
	errInvalidRequest = "invalid_request_error"
	errNotFound       = "not_found_error"
	errServer         = "server_error"
)

// apiError is the body of an OpenAI-shaped error response. Code carries the
// HTTP status, as vLLM does.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// writeError writes {"error": {...}} with the given status. The proxy's
// errors say which leg failed and what the operator can do about it.
func writeError(w http.ResponseWriter, status int, typ, msg string) {
	b, _ := json.Marshal(struct {
		Error apiError `json:"error"`
	}{apiError{Message: msg, Type: typ, Code: status}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
