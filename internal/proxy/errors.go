package proxy

import (
	"net/http"

	"github.com/tandem-serve/tandem/internal/openai"
)

// writeError writes an OpenAI-shaped error ({"error": {"message", "type",
// "param", "code"}}, typed after the status as vLLM and Tandem's engines do)
// with the given status. The proxy's errors say which leg failed and what
// the operator can do about it.
func writeError(w http.ResponseWriter, status int, msg string) {
	h := w.Header()
	h.Del("Content-Length")
	openai.WriteError(w, openai.NewError(status, "", "%s", msg))
}

// writeAPIError writes err, an API error with its own param, as writeError
// does.
func writeAPIError(w http.ResponseWriter, err *openai.Error) {
	w.Header().Del("Content-Length")
	openai.WriteError(w, err)
}
