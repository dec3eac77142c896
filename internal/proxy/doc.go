// Package proxy is Tandem's disaggregated prefill/decode router. It speaks
// vLLM's P/D wire protocol (NIXL connector, pull mode; docs/kv-transfer.md,
// "The HTTP protocol (vLLM's)"), so it can front both Tandem and vLLM
// engines, and vLLM's proxy can front Tandem's. Proxy is the http.Handler
// (New, Serve); Config says what it fronts and how; Backends changes the
// engines at run time.
//
// # Request flow
//
// For each POST /v1/completions or /v1/chat/completions it sends the client's
// body to a prefill engine as a one-token, non-streaming request carrying
// kv_transfer_params{do_remote_decode: true}; copies the kv_transfer_params
// of the prefill's answer verbatim into the client's original body; sends that
// to a decode engine, which pulls the KV blocks; and relays the decode's
// answer to the client: a stream (SSE, or any answer of unknown length)
// chunk by chunk as it arrives, an answer of known length with that length
// in one write. Fields the proxy does not edit reach the engines byte for
// byte as the client sent them. A backend's redirect is never followed.
// Prefill legs always ask for one sample of one token: n is set to 1 when
// the client sent it, best_of is dropped; the decode leg keeps both.
//
// Nothing degrades silently: every answer carries the X-Tandem-Pd header
// ("remote", or "fallback; reason=..." when the prefill leg failed and the
// decode did the whole request), and tandem:proxy_fallbacks_total counts
// fallbacks by reason. A prefill's 4xx is the client's fault and is relayed.
//
// The code follows the request: flow.go (generate: parse, pick the decode,
// decide, then the legs), prefill.go (the prefill leg and its retries),
// decode.go (the decode leg, one decodeAttempt per try), relay.go (the copy
// to the client) and headers.go; conversation mode joins the flow only
// through convTurn (convhistory.go).
//
// # Routing
//
// Backends are picked by the router's pipeline (package router: filters,
// weighted scorers, a picker; made by name in router/factory or from a
// Config.DecodeProfile/PrefillProfile spec). The decode is picked first,
// with the request counted on it at once (requests and tokens in flight) so
// that the next pick sees it; then the disaggregation decider (Config.PDDecider)
// says whether the prompt is prefilled remotely ("remote") or by that decode
// ("local; reason=...", no kv_transfer_params sent); then the prefill engine
// is picked, preferring the decode's host. tandem:proxy_pd_decisions_total
// counts every decision by reason. Signals: the proxy's own accounting, the
// engines' /metrics scraped every Config.ScrapeInterval (stale values
// ignored), and a prefix index: the proxy's record of where it sent which
// prompt blocks, or Config.PrefixIndex (the engines' KV events). Token
// counts are exact with Config.Tokenizer, estimated otherwise.
//
// Backends change at run time through the Backends interface:
// Config.BackendsFile (watched), the admin route /tandem/admin/backends
// (needs the API key), and Kubernetes discovery (package kubediscovery,
// Config.DynamicBackends). A backend removed from the set gets no new
// request; those in flight on it finish.
//
// # Planner
//
// With Config.Planner (`--slo-ttft` and `--slo-tpot`) the proxy runs the
// pool planner (package planner, planner.go here): each routed request (its
// prompt, the part its decode had not cached, its max_tokens) and each
// scrape (prefill and transfer cost, a decode's inter-token latency and
// batch) feed it; every Config.PlanInterval it decides the P:D split, the
// threshold it values the split at (the conditional decider's, taken at
// once; the priced decider's fallback for what it cannot price or serve
// within the objectives: planner_decider.go) and a prefill cadence, and
// publishes them: tandem:planner_* metrics, GET /tandem/plan (read-only;
// `tandem plan` prints it) and Config.OnPlan (Kubernetes scaling, package
// kubediscovery). With Config.PlannerAct the proxy moves engines between
// its pools (planner_move.go): the engine leaves its pool and joins the
// other at once (no new leg of its old role), while its old role's work
// (its legs in flight, and the KV it holds for decodes already sent, read
// or released when they end: backend.holds) goes on to the end; until it
// has, the engine is not moved again nor counted as switched. The engines
// serve both roles (tandem serve --role both), so a switch changes nothing
// on the engine. No client request can move one.
//
// # Failures
//
// A prefill leg that fails on the engine's side is retried on another
// prefill engine (Config.PrefillRetries) before the fallback; a decode leg
// that fails before its first byte on another decode (Config.DecodeRetries),
// and the failed attempt stops counting on its engine's load at once. A 503
// from either is such a failure (a draining engine refuses new work with it,
// before reading any KV), and marks the engine down until its next passing
// health check, so a pod turned unready mid-load costs no request. A remote
// decode leg that failed otherwise after it was sent may have had its KV
// pulled (a pull frees it on the prefill), so its retry goes without
// kv_transfer_params: the retry's decode prefills the prompt itself
// (X-Tandem-Pd "fallback; reason=decode_retry"), and the prefill's hold is
// released; only a failed connect or a 503 keep the params. An engine
// is skipped from a failed connection until its next passing health check,
// and ejected for a doubling cool-down after three failed legs in a row
// (circuit breaker); a decode's 5xx to a leg that carried kv_transfer_params
// does not count (it may be the transfer's failure: params spent or expired,
// a prefill gone). When every candidate is saturated a request waits in a
// bounded queue (Config.QueueTimeout, Config.MaxQueue), then gets 429 with
// Retry-After. Every backend call is bounded by a connect timeout; each leg
// attempt by Config.FirstByteTimeout until its first byte (a prefill's
// answer; a decode's headers and first body byte), then retried as above or
// answered 504; the prefill leg's attempts together by Config.Timeout; each
// gap between the decode's chunks by Config.StallTimeout (a stalled stream
// is cut), never a stream's total length. A client that goes away cancels
// the decode leg at once and the prefill leg after
// Config.CanceledPrefillGrace: a prefill engine finishes a forward pass it
// has begun, and an answer within the grace lets the proxy release the KV it
// holds. A request that fails for a reason of the proxy's own gets a generic
// 500; the details are in the log under its request id.
//
// A /v1/completions request whose prompt is a batch (a list of prompts) is
// prefilled by its decode ("local; reason=batch_prompt"): params name one
// prompt's KV, and engines refuse them on a batch.
//
// No stranded KV (docs/kv-transfer.md, "The transfer contract"): when a
// prefill answered with kv_transfer_params but the decode leg never started
// or may not have pulled them (client gone, no decode healthy or reachable,
// the decode answered 4xx/5xx or no first byte in time, a retry without
// them), the proxy posts the params back to that prefill's POST
// /tandem/kv/release in the background, bounded by Config.ReleaseTimeout,
// and counts it in tandem:proxy_kv_releases_total{reason, result}.
//
// # Trust boundary
//
// kv_transfer_params make an engine hold KV (prefill) or
// dial a peer and read it (decode), so only the proxy writes them. A client's
// own kv_transfer_params (under any spelling encoding/json would match, such
// as "KV_Transfer_Params") are replaced on the prefill leg by the proxy's
// request (or, in conversation mode, by a decode's answer the proxy kept), on
// a remote decode leg by the prefill's answer, and dropped on a fallback
// decode leg. With Config.APIKey, clients need "Authorization:
// Bearer <key>" on every path but /health and /metrics (401 otherwise);
// backends get Config.BackendAPIKey (default: APIKey) in place of the
// client's header on every call, health checks included. X-Request-Id
// values that are not printable ASCII are refused with 400 before any leg.
//
// # Conversation mode
//
// Conversation mode (Config.Conversations, `tandem proxy --conversations`)
// is the proxy's half of multi-turn KV reuse with engines started with
// --kv-bidirectional (docs/kv-transfer.md, "The next turn (bidirectional)"). A request names its conversation
// with a conversation_id body field (as vLLM's disagg_proxy_multiturn.py)
// or an X-Conversation-Id header; the proxy removes the field from every
// leg. When a turn's decode answers 200 with kv_transfer_params (the JSON
// body's, or any streamed chunk's), the proxy takes them out of the answer
// the client gets and remembers them, with the decode that sent them, in a
// bounded LRU map (Config.ConversationMaxEntries) until the params'
// remote_blocks_expiry_time (or Config.ConversationTTL when they have none).
// The next turn takes them (params name blocks a prefill consumes once):
// its prefill leg carries them verbatim in place of {"do_remote_decode":
// true}, so the prefill pulls the history's KV from that decode and computes
// only the new tokens, and its decode leg goes to the same decode while it
// is healthy (its prefix cache holds the history). A prefill leg with history
// that fails in any way but the client leaving is retried once without it,
// then handled as any failed prefill leg. A decode's hold that no turn will
// use is released on that decode's /tandem/kv/release (the decode signed
// the params): the answer of a request naming no conversation that is not
// remembered by its history, a conversation evicted for room or replaced by
// a concurrent turn (or, by history, superseded by a longer one), history a
// retried prefill did not pull, params whose answer did not reach the
// client whole, and every remembered hold when Serve stops. Expired holds
// the decode frees itself.
//
// With the model's tokenizer (Config.Tokenizer), a request naming no
// conversation is matched by prompt prefix (convhistory.go): finished turns
// of such requests are remembered under the chained block hashes of their
// history (prompt and answer re-tokenized, cut to remote_num_tokens), and a
// later one whose prompt starts with at least
// Config.ConversationMinPrefixTokens of a remembered history continues it,
// longest match first. Without the tokenizer this is off and said once in
// the log.
//
// tandem:proxy_conversation_* metrics count lookups (hit/miss; by prompt
// prefix hit/partial/miss), evictions (capacity/expired/replaced), params
// kept, prefill legs sent with history, retries and decode affinity;
// tandem:proxy_kv_releases_total the releases.
//
// Conversation ids are client-chosen and not secrets. They only select which
// params the proxy sends; a client still never writes kv_transfer_params,
// and a history that is not a prefix of the new prompt is the engines' to
// detect (the prefill checks the pulled blocks' token hashes and recomputes).
package proxy
