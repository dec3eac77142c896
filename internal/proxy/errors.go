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

// writeInternalError answers a request that failed for a reason of the
// proxy's own (not the client's, not a backend's) with a generic 500: what
// went wrong can name backends and internal ids, so it goes to the log only,
// under the request's id (id, the X-Request-Id of the answer; "" for a
// request without one).
func (p *Proxy) writeInternalError(w http.ResponseWriter, id, what string, err error) {
	p.log.Error("internal error; the client gets a generic 500", "request_id", id, "during", what, "err", err)
	writeError(w, http.StatusInternalServerError,
		"internal error in the proxy; retry, and if it persists give the operator the answer's X-Request-Id: the proxy's log has the details")
}
