// Package proxy is Tandem's disaggregated prefill/decode router. It speaks
// vLLM's P/D wire protocol (NIXL connector, pull mode), so it can front both
// Tandem and vLLM engines, and vLLM's proxy can front Tandem's.
//
// For each POST /v1/completions or /v1/chat/completions it sends the client's
// body to a prefill engine as a one-token, non-streaming request carrying
// kv_transfer_params{do_remote_decode: true}; copies the kv_transfer_params
// of the prefill's answer verbatim into the client's original body; sends that
// to a decode engine, which pulls the KV blocks; and relays the decode's
// answer (JSON or SSE) to the client chunk by chunk. Fields the proxy does not
// edit reach the engines byte for byte as the client sent them.
//
// Nothing degrades silently: every answer carries the X-Tandem-Pd header
// ("remote", or "fallback; reason=..." when the prefill leg failed and the
// decode did the whole request), and tandem:proxy_fallbacks_total counts
// fallbacks by reason. A prefill's 4xx is the client's fault and is relayed.
//
// Backends are picked per pool by a policy (package picker and its
// subfolders) among those whose last health check passed; a background
// checker polls each backend's /health. Every backend call is bounded by a
// connect timeout and by Config.Timeout on the prefill leg, the decode's
// headers and each gap between the decode's chunks, never on a stream's total
// length. A client that goes away cancels both legs.
//
// Trust boundary: kv_transfer_params make an engine hold KV (prefill) or
// dial a peer and read it (decode), so only the proxy writes them. A client's
// own kv_transfer_params (under any spelling encoding/json would match, such
// as "KV_Transfer_Params") are replaced on the prefill leg by the proxy's
// request, on a remote decode leg by the prefill's answer, and dropped on a
// fallback decode leg. With Config.APIKey, clients need "Authorization:
// Bearer <key>" on every path but /health and /metrics (401 otherwise);
// backends get Config.BackendAPIKey (default: APIKey) in place of the
// client's header on every call, health checks included. X-Request-Id
// values that are not printable ASCII are refused with 400 before any leg.
//
// No stranded KV: when a prefill answered with kv_transfer_params but the
// decode leg never started (client gone, no decode healthy or reachable, the
// decode answered 4xx/5xx or no headers in time), the proxy posts the params
// back to that prefill's POST /tandem/kv/release in the background, bounded
// by Config.ReleaseTimeout, and counts it in
// tandem:proxy_kv_releases_total{reason, result}.
package proxy
