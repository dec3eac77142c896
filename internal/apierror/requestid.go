package apierror

// MaxRequestIDLen bounds the X-Request-Id header a client may send. It is
// room for a UUID with a prefix, or for the long ids of vLLM's P2P proxy
// (which name both engines' addresses).
const MaxRequestIDLen = 256

// CheckRequestID returns a 400 naming the X-Request-Id header unless id is
// empty (the server makes one) or at most MaxRequestIDLen printable ASCII
// characters without spaces (0x21-0x7e). The id is echoed in headers, set in
// response ids and written to logs, so bytes that could forge a log line,
// hide in a terminal or break a header never get that far.
func CheckRequestID(id string) *Error {
	if len(id) > MaxRequestIDLen {
		return BadRequest("X-Request-Id", "X-Request-Id is longer than %d bytes", MaxRequestIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return BadRequest("X-Request-Id", "X-Request-Id may hold only printable ASCII characters without spaces (0x21-0x7e); byte %d is 0x%02x", i, c)
		}
	}
	return nil
}
