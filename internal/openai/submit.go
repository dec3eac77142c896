package openai

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvparams"
)

// submitError maps an error from Backend.Submit to an API error: the
// engine's InvalidRequestError is a 400, ErrShuttingDown a 503, anything else
// a 500.
func submitError(err error) *Error {
	if e, ok := errors.AsType[*Error](err); ok {
		return e
	}
	if ire, ok := errors.AsType[*engine.InvalidRequestError](err); ok {
		return BadRequest(ire.Param, "%s", ire.Message)
	}
	if errors.Is(err, engine.ErrShuttingDown) {
		return NewError(http.StatusServiceUnavailable, "", "the server is shutting down; retry on another instance")
	}
	return NewError(http.StatusInternalServerError, "", "submitting the request to the engine: %v", err)
}

// KVRejecter is implemented by backends with a KV connector. A decode leg
// refused before it reaches the engine (a bad sampling value, a chat
// template error) still names blocks a prefill engine holds for it;
// RejectKVTransfer tells that engine to free them now rather than at lease
// expiry (vLLM's pre-admission rejection cleanup, PR #41269).
type KVRejecter interface {
	RejectKVTransfer(kv *kvparams.Params)
}

// rejectKV passes a refused request's kv_transfer_params to the backend's
// connector, if it has one. Unparseable params name nothing to free.
func (s *Server) rejectKV(raw json.RawMessage) {
	kr, ok := s.cfg.Backend.(KVRejecter)
	if !ok {
		return
	}
	if kv, err := parseKVTransfer(raw); err == nil && kv != nil {
		kr.RejectKVTransfer(kv)
	}
}
