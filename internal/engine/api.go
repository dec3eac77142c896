package engine

import (
	"encoding/json"
	"time"

	"github.com/tandem-serve/tandem/internal/kvparams"
	"github.com/tandem-serve/tandem/internal/sample"
)

// Request is one generation request as the API layer submits it.
type Request struct {
	// ID is the external request id (X-Request-Id or generated).
	ID     string
	Prompt []int32
	Params sample.Params
	// KVTransfer is the request's kv_transfer_params, as the API layer
	// parsed them from the JSON body (nil when absent or null). The KV
	// connector checks them against the prompt (KVRequestChecker).
	KVTransfer *kvparams.Params
}

// FinishReason says why a request ended.
type FinishReason string

const (
	// FinishNone marks an Event of a request still running.
	FinishNone FinishReason = ""
	// FinishStop: EOS, a stop token or a stop string.
	FinishStop FinishReason = "stop"
	// FinishLength: the output reached its maximum length.
	FinishLength FinishReason = "length"
	// FinishAbort: the request was aborted (Abort, or the engine shut
	// down before it finished).
	FinishAbort FinishReason = "abort"
	// FinishError: the request failed; Event.Err says why.
	FinishError FinishReason = "error"
)

// TopLogprob is one alternative token and its log-probability.
type TopLogprob struct {
	Token   int32
	Logprob float32
}

// TokenLogprob is the log-probability of a sampled token and, if asked for,
// the top alternatives at that position.
type TokenLogprob struct {
	Token   int32
	Logprob float32
	Top     []TopLogprob
}

// Usage counts a request's tokens.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens is the number of prompt tokens whose KV the engine did
	// not compute: local prefix-cache hits plus tokens a KV connector
	// loaded from another engine, as vLLM counts them (#44607)
	// (prompt_tokens_details.cached_tokens).
	CachedTokens int
}

// Event is one update on a request's stream. Events carry the tokens sampled
// since the previous event and the text they completed; the last event has
// Finish set (and Err for FinishError).
type Event struct {
	Tokens   []int32
	Text     string
	Logprobs []TokenLogprob // parallel to Tokens when logprobs were asked for
	Finish   FinishReason
	// StopReason is the matched stop string or stop token id (as string)
	// when Finish is FinishStop because of one.
	StopReason string
	Err        error
	// KVTransfer is set on the final event of a prefill-for-remote-decode
	// request: the params the decode engine needs, a JSON object the KV
	// connector marshalled (kvparams.Params), for the API layer to send on
	// verbatim.
	KVTransfer json.RawMessage
	Usage      Usage
	// Timing is set on the event that carries a request's first token:
	// where its time went until then.
	Timing *Timing
}

// Timing splits the time from a request's arrival at the engine to its
// first token (the engine's part of TTFT) into phases, as llm-d's "true
// TTFT" spans do. The API layer reports it in the Server-Timing header.
type Timing struct {
	// Queue is from arrival to admission: the scheduler gave the request
	// its blocks (and, for a remote prefill, started the KV load) or first
	// scheduled it.
	Queue time.Duration
	// KVLoad is from admission to the end of loading the prompt's KV from
	// another engine (a KV connector's pull); 0 when nothing was loaded.
	// For such a request Queue is the fetch's waiting_to_start stage and
	// KVLoad its in_progress stage.
	KVLoad time.Duration
	// KVReady is, after an asynchronous load, from its end to the step
	// that first ran the request (the fetch's completed_waiting stage);
	// 0 otherwise.
	KVReady time.Duration
	// Prefill is from then to the first token: computing the uncached
	// prompt, in chunks interleaved with other requests' steps.
	Prefill time.Duration
}

// Handle is a submitted request. Events is closed after the final event.
type Handle struct {
	// ID is the engine's internal id of the request (the client's id plus
	// a random suffix): pass it to Abort. A KV connector names the request
	// by it (remote_request_id).
	ID     string
	Events <-chan Event
}
