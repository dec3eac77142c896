package openai

import (
	"errors"
	"net/http"

	"github.com/tandem-serve/tandem/internal/engine"
)

// submitError maps an error from Backend.Submit to an API error: the
// engine's InvalidRequestError is a 400, ErrShuttingDown a 503, anything else
// a 500.
func submitError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var ire *engine.InvalidRequestError
	if errors.As(err, &ire) {
		return BadRequest(ire.Param, "%s", ire.Message)
	}
	if errors.Is(err, engine.ErrShuttingDown) {
		return NewError(http.StatusServiceUnavailable, "", "the server is shutting down; retry on another instance")
	}
	return NewError(http.StatusInternalServerError, "", "submitting the request to the engine: %v", err)
}
