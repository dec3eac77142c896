package proxy

import (
	"net/http"

	"github.com/tandem-serve/tandem/internal/apierror"
)

// writeError writes an OpenAI-shaped error ({"error": {"message", "type",
// "param", "code"}}, typed after the status as vLLM and Tandem's engines do)
// with the given status. The proxy's errors say which leg failed and what
// the operator can do about it.
func writeError(w http.ResponseWriter, status int, msg string) {
	h := w.Header()
	h.Del("Content-Length")
	apierror.WriteError(w, apierror.NewError(status, "", "%s", msg))
}

// writeAPIError writes err, an API error with its own param, as writeError
// does.
func writeAPIError(w http.ResponseWriter, err *apierror.Error) {
	w.Header().Del("Content-Length")
	apierror.WriteError(w, err)
}
