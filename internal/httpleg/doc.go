// Package httpleg is the HTTP/1.1 client of the proxy's legs: an
// http.RoundTripper that writes a request and reads its answer on the
// calling goroutine, over a bounded pool of keep-alive connections per
// host.
//
// net/http's Transport runs a reader and a writer goroutine per connection
// and hands every request and answer between them and the caller over
// channels; for the proxy's short legs to engines on the same network that
// machinery was about 40% of the proxy's CPU. Here a leg is one write of the
// request (head and body together, by writev for a large body),
// http.ReadResponse on the connection's bufio.Reader, and reads of the body
// by the caller itself. Cancellation
// needs no goroutine either: context.AfterFunc moves the connection's
// deadline into the past, which unblocks whatever read or write is under
// way, and the error is reported as the context's.
//
// The price is what a background reader gives net/http for free: noticing
// that a server closed an idle connection. A connection idle for a while is
// probed with a non-blocking peek before use (Linux, macOS), and a request
// that fails on a reused connection before any byte of its answer arrived is
// sent once more on a fresh one, as net/http does.
//
// Only plain http:// requests of known length are handled; anything else
// (https, a body of unknown length, CONNECT, trailers) goes to
// Transport.Fallback, normally a net/http Transport.
package httpleg
