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
// Choices: n (1..MaxN) asks for n choices per prompt, indexed prompt by
// prompt (choice c of prompt p is p*n+c), streamed interleaved with their
// index; usage counts each prompt once and the completion tokens of every
// choice. The prompt is computed once: choice 0 goes to the engine first,
// and the others are submitted when it produces its first token, so they
// find its blocks in the prefix cache (see run). With a seed, choice c
// samples with seed+c, vLLM v1's rule, so choice 0 equals the n = 1 answer.
// On a decode engine only choice 0 carries kv_transfer_params (it pulls the
// prompt's KV); a prefill leg (do_remote_decode) always runs one choice.
// best_of is accepted only equal to n: like vLLM v1, Tandem does not rank
// extra samples.
//
// Echo: a completion with echo starts each choice's text with its prompt's
// (the first streamed chunk of a choice carries it). With logprobs, OpenAI
// and vLLM also return the prompt's logprobs, which the engine does not
// compute, so echo with logprobs is a 400.
//
// Chat templates: Config.ChatTemplate is the model's template or the one
// given with `tandem serve --chat-template` (a file, or the template text,
// as vLLM's flag; LoadChatTemplate resolves it), so a model without a
// template can serve chat. A request's own chat_template field is rendered
// only when Config.RequestChatTemplate is set
// (--trust-request-chat-template, as in vLLM), else refused with a 400.
//
// Request ids: the X-Request-Id header (or a random id) names the request in
// the response header and in the response id (cmpl-<id>, chatcmpl-<id>). An
// id that is not 1-256 printable ASCII characters without spaces (0x21-0x7e)
// is refused with a 400 naming the header, before it reaches a log or a
// header. The engine sees the id with a random suffix, as vLLM does, so a
// client that reuses an id while an earlier request with it is still in
// flight (or still holds KV blocks for a remote decode) gets two distinct
// engine requests rather than a confused one.
//
// Probes: GET /health is readiness (vLLM's tools and Tandem's proxy probe
// it): 200 while the engine takes requests, 503 with Retry-After from the
// moment Drain is called (the first SIGTERM of `tandem serve`). GET /livez
// is liveness: 200 as long as the process serves HTTP, draining included,
// so that an orchestrator's liveness probe does not kill an engine that is
// finishing its requests or serving held KV. While draining, new
// completion and chat requests get a 503 ServiceUnavailableError ("retry
// on another instance") before they reach the engine, which a router
// retries elsewhere; requests in flight run on (InFlight counts them);
// /metrics, /tokenize and KV release keep working.
//
// Timing: every completion and chat answer carries a Server-Timing header
// (HeaderServerTiming) with where its time went before the first token —
// the server's own handling, the engine's queue, a KV pull from a prefill
// engine, the prefill — set before the first byte, so a client (tandem
// bench) gets per-request spans; the P/D proxy appends its own.
//
// API keys: with Config.APIKey set (`tandem serve --api-key`, or
// TANDEM_API_KEY), every path except the probes in OpenPaths (/health,
// /livez, /metrics) needs "Authorization: Bearer <key>", unknown paths included;
// the key is compared as a SHA-256 digest in constant time and a missing or
// wrong one gets a 401 AuthenticationError with a WWW-Authenticate
// challenge. vLLM protects only /v1/*; Tandem protects everything that is
// not a probe. The proxy reuses APIKey.
//
// KV release: POST /tandem/kv/release with {"kv_transfer_params": ...} (the
// params a prefill answered) frees the blocks the engine holds for that
// remote decode, through Config.KVReleaser (the engine's KV connector, which
// accepts only params it signed). 200 {"released": true}; 400 for params it
// refuses; 404 when nothing is held or the engine has no connector. The P/D
// proxy calls it when a decode leg never starts. A prefill leg whose answer
// cannot be delivered (its client left before the forward pass finished, or
// the write failed) is released the same way at once, since nobody else has
// its params; Config.KVReleased counts both (reasons "request",
// "client_gone").
package openai
