package apierror

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// APIKeyEnv is the environment variable `tandem serve` and `tandem proxy`
// read their --api-key from when the flag is not given (vLLM's is
// VLLM_API_KEY). The environment keeps the key out of the process list.
const APIKeyEnv = "TANDEM_API_KEY"

// OpenPaths are served without an API key: the probes that load balancers,
// orchestrators and Prometheus call without credentials (readiness /health,
// liveness /livez, /metrics). Every other path, including unknown ones (so
// that a client without the key cannot map the routes), needs the key.
// vLLM protects only /v1/*; Tandem also protects /tokenize, /detokenize,
// /version and /tandem/kv/release, which either cost compute, reveal the
// deployment or change KV state.
var OpenPaths = map[string]bool{"/health": true, "/livez": true, "/metrics": true}

// APIKey checks "Authorization: Bearer <key>" headers against one key. The
// zero value and nil accept every request (no key configured).
type APIKey struct {
	sum [sha256.Size]byte
	set bool
}

// NewAPIKey returns a checker for key; an empty key accepts everything.
func NewAPIKey(key string) *APIKey {
	if key == "" {
		return &APIKey{}
	}
	return &APIKey{sum: sha256.Sum256([]byte(key)), set: true}
}

// Enabled reports whether a key is configured.
func (k *APIKey) Enabled() bool { return k != nil && k.set }

// Check returns nil when r may pass: no key is configured, its path is one
// of OpenPaths, or it carries the key as a bearer token. Otherwise it
// returns a 401 that never repeats what the client sent. The tokens are
// compared as SHA-256 digests in constant time, so neither the key's bytes
// nor its length leak through timing.
func (k *APIKey) Check(r *http.Request) *Error {
	if !k.Enabled() || OpenPaths[r.URL.Path] {
		return nil
	}
	token, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok {
		return NewError(http.StatusUnauthorized, "", "missing API key: send it as the header Authorization: Bearer <key>")
	}
	sum := sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(sum[:], k.sum[:]) != 1 {
		return NewError(http.StatusUnauthorized, "", "invalid API key")
	}
	return nil
}

// bearerToken returns the token of an "Authorization: Bearer <token>"
// value. The scheme is case-insensitive (RFC 9110 §11.1).
func bearerToken(h string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// WriteUnauthorized writes err, a 401 from Check, with the WWW-Authenticate
// challenge RFC 6750 asks for.
func WriteUnauthorized(w http.ResponseWriter, err *Error) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="tandem"`)
	WriteError(w, err)
}
