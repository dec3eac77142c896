// Package httpguard refuses or fences off HTTP requests that no Tandem
// client sends and that a browser or a request smuggler would: it is the one
// place where the engines' OpenAI server (package openai) and the router
// (package proxy) check what arrives before their handlers parse it.
//
// Wrap puts these checks in front of a handler, in this order (the server's
// API key, Options.Authorize, comes second, so that a caller without the key
// gets a 401 whatever else is wrong):
//
//   - Framing. A request that carried Transfer-Encoding, or any HTTP/1.0
//     request, is answered with "Connection: close" and the connection is
//     closed after the answer. RFC 9112 §6.1 requires this for a request
//     with both Content-Length and Transfer-Encoding (a smuggling attempt:
//     a front end that trusted Content-Length and one that trusted
//     Transfer-Encoding disagree on where the next request starts) and for
//     an HTTP/1.0 request with Transfer-Encoding. net/http deletes
//     Content-Length when Transfer-Encoding is chunked, and deletes
//     Transfer-Encoding from HTTP/1.0 requests, before a handler runs, so the
//     handler cannot tell these cases from the harmless ones; closing after
//     every chunked or HTTP/1.0 request covers them all. Tandem's own
//     clients send Content-Length over HTTP/1.1 and keep their connections.
//     An obs-folded header ("Transfer-Encoding:\r\n chunked") is unfolded by
//     net/http (RFC 9112 §5.2 allows that) and then falls under the same rule.
//   - Content type. A POST to a JSON path must say Content-Type:
//     application/json (parameters such as charset allowed, case ignored),
//     else 415 with an OpenAI-shaped error. A browser can send text/plain,
//     a form or multipart without a CORS preflight; application/json needs
//     one, which neither server grants, so a web page cannot make a
//     visitor's browser run completions on a server without an API key.
//   - UTF-8. The body of such a POST is read through a reader that fails at
//     the first byte that is not UTF-8 (RFC 8259 §8.1: JSON exchanged between
//     systems is UTF-8). encoding/json would replace such bytes with U+FFFD
//     and run a request the client did not send; the handlers' body readers
//     turn the reader's error into a 400.
//
// It imports only the standard library and package apierror (the error
// shape), so the router links nothing more for it.
package httpguard
