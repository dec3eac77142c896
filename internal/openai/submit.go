package openai

import (
	"errors"
	"net/http"
)

// submitError maps an error from Backend.Submit to an API error.
func submitError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return NewError(http.StatusInternalServerError, "", "submitting the request to the engine: %v", err)
}
