package engine

import "errors"

// InvalidRequestError is a request the engine refuses as malformed; the API
// layer answers it with HTTP 400.
type InvalidRequestError struct {
	// Message says what is wrong and what to change.
	Message string
	// Param names the offending request field ("prompt", "max_tokens").
	Param string
}

// Error implements error.
func (e *InvalidRequestError) Error() string {
	if e.Param == "" {
		return e.Message
	}
	return e.Param + ": " + e.Message
}

// ErrShuttingDown is returned by Submit once Shutdown has begun.
var ErrShuttingDown = errors.New("engine: shutting down, not accepting requests")
