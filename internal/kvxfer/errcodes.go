package kvxfer

import (
	"fmt"
)

// The ERROR frame: its codes (part of the wire format) and RemoteError,
// what a received one becomes (errors.go says which errors it matches).

// ErrorCode classifies an ERROR frame.
type ErrorCode uint16

// Error codes. Values are part of the wire format: never renumber.
const (
	CodeBadFrame          ErrorCode = 1 // the peer violated the protocol; connection closed
	CodeVersion           ErrorCode = 2 // unsupported protocol version
	CodeNotHeld           ErrorCode = 3 // request unknown, released or expired
	CodeBadBlock          ErrorCode = 4 // block id not part of the held request
	CodeGenerationChanged ErrorCode = 5 // a block was reused while being read
	CodeBusy              ErrorCode = 6 // connection limit reached
	CodeShuttingDown      ErrorCode = 7 // producer is closing
	CodeNoShm             ErrorCode = 8 // producer does not offer shared memory
	CodeInternal          ErrorCode = 9
	CodeUnauthenticated   ErrorCode = 10 // the handshake's proof did not match the secret
)

// String is the code's snake_case name.
func (c ErrorCode) String() string {
	switch c {
	case CodeBadFrame:
		return "bad_frame"
	case CodeVersion:
		return "version"
	case CodeNotHeld:
		return "not_held"
	case CodeBadBlock:
		return "bad_block"
	case CodeGenerationChanged:
		return "generation_changed"
	case CodeBusy:
		return "busy"
	case CodeShuttingDown:
		return "shutting_down"
	case CodeNoShm:
		return "no_shm"
	case CodeInternal:
		return "internal"
	case CodeUnauthenticated:
		return "unauthenticated"
	}
	return fmt.Sprintf("code_%d", uint16(c))
}

// RemoteError is an ERROR frame received from the peer.
type RemoteError struct {
	Code    ErrorCode
	Message string
}

// Error returns the peer's message.
func (e *RemoteError) Error() string { return e.Message }

func appendError(b []byte, code ErrorCode, msg string) []byte {
	b = appendU16(b, uint16(code))
	return appendString(b, msg)
}

func decodeError(p []byte) *RemoteError {
	d := decoder{b: p}
	code := ErrorCode(d.u16("error code"))
	msg := d.str("error message")
	if d.err != nil {
		return &RemoteError{Code: CodeBadFrame, Message: fmt.Sprintf("peer sent an undecodable ERROR frame: %v", d.err)}
	}
	return &RemoteError{Code: code, Message: msg}
}
