package openai

import "github.com/tandem-serve/tandem/internal/apierror"

// The error shape, API keys and the request-id check live in the leaf
// package apierror so that the router can use them without linking the
// engine; the aliases below are the names this package's code uses.
type (
	// Error is apierror.Error.
	Error = apierror.Error
	// ErrorBody is apierror.ErrorBody.
	ErrorBody = apierror.ErrorBody
	// APIKey is apierror.APIKey.
	APIKey = apierror.APIKey
)

// Error types by status, as vLLM names them.
const (
	TypeBadRequest       = apierror.TypeBadRequest
	TypeUnauthorized     = apierror.TypeUnauthorized
	TypeNotFound         = apierror.TypeNotFound
	TypeMethodNotAllowed = apierror.TypeMethodNotAllowed
	TypeTooLarge         = apierror.TypeTooLarge
	TypeUnavailable      = apierror.TypeUnavailable
	// APIKeyEnv is apierror.APIKeyEnv.
	APIKeyEnv = apierror.APIKeyEnv
	// MaxRequestIDLen is apierror.MaxRequestIDLen.
	MaxRequestIDLen = apierror.MaxRequestIDLen
)

// OpenPaths is apierror.OpenPaths.
var OpenPaths = apierror.OpenPaths

// NewError returns an error with the given status; see apierror.NewError.
func NewError(status int, param, format string, args ...any) *Error {
	return apierror.NewError(status, param, format, args...)
}

// BadRequest returns a 400 error naming param; see apierror.BadRequest.
func BadRequest(param, format string, args ...any) *Error {
	return apierror.BadRequest(param, format, args...)
}

// Functions re-exported from apierror.
var (
	WriteError     = apierror.WriteError
	NewAPIKey      = apierror.NewAPIKey
	CheckRequestID = apierror.CheckRequestID
)
