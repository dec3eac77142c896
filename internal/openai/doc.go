// Package openai is Tandem's OpenAI-compatible HTTP API: the request and
// response types of /v1/completions and /v1/chat/completions (with vLLM's
// extensions such as top_k and kv_transfer_params), the server that turns
// those requests into engine requests and engine events back into responses
// and server-sent event streams, and the OpenAI-shaped error and SSE helpers
// that the P/D proxy reuses.
//
// One Server fronts one engine. It owns no model state: it tokenizes,
// validates, submits to the engine and formats what comes back. Errors follow
// vLLM's shape, {"error": {"message", "type", "param", "code"}}, with the type
// named after the HTTP status (BadRequestError, NotFoundError, ...) and code the
// numeric status, so clients written against vLLM keep working.
//
// Request ids: the X-Request-Id header (or a random id) names the request in
// the response header and in the response id (cmpl-<id>, chatcmpl-<id>). The
// engine sees that id with a random suffix, as vLLM does, so a client that
// reuses an id while an earlier request with it is still in flight (or still
// holds KV blocks for a remote decode) gets two distinct engine requests
// rather than a confused one.
package openai
