package apierror

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// Error is an API error as the client sees it. It renders as
// {"error": {"message", "type", "param", "code"}} with the HTTP status Status.
type Error struct {
	// Status is the HTTP status code.
	Status int
	// Type is vLLM's error type for the status (BadRequestError, ...).
	Type string
	// Message says what went wrong and, where it can, what to do about it.
	Message string
	// Param names the offending request field ("" when none).
	Param string
}

// Error implements error.
func (e *Error) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("%d %s: %s (param %s)", e.Status, e.Type, e.Message, e.Param)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Type, e.Message)
}

// ErrorBody is the JSON body of an error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the object inside an ErrorBody. Code is the HTTP status, as
// vLLM sends it.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// Body returns the error's JSON body.
func (e *Error) Body() ErrorBody {
	var param *string
	if e.Param != "" {
		p := e.Param
		param = &p
	}
	return ErrorBody{Error: ErrorDetail{Message: e.Message, Type: e.Type, Param: param, Code: e.Status}}
}

// Error types by status, as vLLM names them.
const (
	TypeBadRequest       = "BadRequestError"
	TypeUnauthorized     = "AuthenticationError" // the OpenAI clients' name for a 401
	TypeNotFound         = "NotFoundError"
	TypeMethodNotAllowed = "MethodNotAllowedError"
	TypeTooLarge         = "RequestEntityTooLargeError"
	// TypeUnsupportedMediaType: a body that is not application/json.
	TypeUnsupportedMediaType = "UnsupportedMediaTypeError"
	TypeInternal             = "InternalServerError"
	TypeUnavailable          = "ServiceUnavailableError"
)

// typeForStatus returns the error type for an HTTP status.
func typeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return TypeBadRequest
	case http.StatusUnauthorized:
		return TypeUnauthorized
	case http.StatusNotFound:
		return TypeNotFound
	case http.StatusMethodNotAllowed:
		return TypeMethodNotAllowed
	case http.StatusRequestEntityTooLarge:
		return TypeTooLarge
	case http.StatusUnsupportedMediaType:
		return TypeUnsupportedMediaType
	case http.StatusServiceUnavailable:
		return TypeUnavailable
	default:
		return TypeInternal
	}
}

// NewError returns an error with the given status, its vLLM type, and a
// formatted message.
func NewError(status int, param, format string, args ...any) *Error {
	return &Error{Status: status, Type: typeForStatus(status), Param: param, Message: fmt.Sprintf(format, args...)}
}

// BadRequest returns a 400 error naming param.
func BadRequest(param, format string, args ...any) *Error {
	return NewError(http.StatusBadRequest, param, format, args...)
}

// WriteError writes err as a JSON error response. Errors that are not *Error
// become a 500 InternalServerError carrying err's message.
func WriteError(w http.ResponseWriter, err error) {
	var e *Error
	if !errors.As(err, &e) {
		e = NewError(http.StatusInternalServerError, "", "%v", err)
	}
	body, _ := json.Marshal(e.Body()) // a struct of strings and an int always marshals
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	if e.Status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(body)
}
