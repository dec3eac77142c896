package httpguard

import (
	"net/http"

	"github.com/tandem-serve/tandem/internal/apierror"
)

// Options says which requests carry a JSON body, and who may send them.
type Options struct {
	// JSONPaths are the URL paths whose POST requests must carry a JSON
	// body: their content type and UTF-8 are checked. Other paths and
	// methods pass through unchecked but for framing.
	JSONPaths []string
	// Authorize, when set, checks every request after the framing check
	// and before the others; a request it returns an error for is answered
	// with apierror.WriteUnauthorized and goes no further. The servers check
	// the API key here, so that a caller without the key learns nothing
	// from any answer but 401, as vLLM checks the key first.
	Authorize func(r *http.Request) *apierror.Error
}

// Wrap returns h behind the package's checks (see the package doc): framing
// on every request, then o.Authorize, then content type and UTF-8 on POSTs
// to o.JSONPaths. A request with the wrong content type is answered 415
// before h runs.
func Wrap(h http.Handler, o Options) http.Handler {
	paths := make(map[string]bool, len(o.JSONPaths))
	for _, p := range o.JSONPaths {
		paths[p] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if AmbiguousFraming(r) {
			// Set before h writes anything: net/http closes the connection
			// after a response that carries it, whatever h answers.
			w.Header().Set("Connection", "close")
		}
		if o.Authorize != nil {
			if err := o.Authorize(r); err != nil {
				apierror.WriteUnauthorized(w, err)
				return
			}
		}
		if r.Method != http.MethodPost || !paths[r.URL.Path] {
			h.ServeHTTP(w, r)
			return
		}
		if err := CheckContentType(r.Header); err != nil {
			apierror.WriteError(w, err)
			return
		}
		r2 := new(http.Request)
		*r2 = *r
		r2.Body = UTF8Body(r.Body)
		h.ServeHTTP(w, r2)
	})
}

// AmbiguousFraming reports whether the connection r came on must be closed
// after the answer: r is HTTP/1.1 and carried Transfer-Encoding (perhaps
// beside a Content-Length net/http has removed), or r is HTTP/1.0 (whose
// Transfer-Encoding net/http has removed). HTTP/2 frames bodies itself.
func AmbiguousFraming(r *http.Request) bool {
	return r.ProtoMajor == 1 && (r.ProtoMinor == 0 || len(r.TransferEncoding) > 0)
}
