package sched

import (
	"encoding/json"
	"errors"
)

// Connector is the scheduler half of a KV connector, mirroring vLLM's
// KVConnectorBase_V1 scheduler-side methods. The scheduler calls it from the
// step loop only, so implementations need no locking for these calls; the
// worker half (which moves bytes) reports back through
// Scheduler.UpdateFromConnector.
//
// Blocks passed to a Connector belong to the scheduler: the connector may
// keep the ids, but must only hand them to a transfer between the step that
// reported them and the completion it reports for the request.
type Connector interface {
	// OnNewRequest is called once when the request is added, before any
	// scheduling (for example to start heartbeats for a remote prefill that
	// holds the request's KV while it queues here).
	OnNewRequest(r *Request)

	// GetNumNewMatchedTokens returns how many tokens after the first
	// numLocalComputed (the local prefix-cache hit) the connector can load
	// from elsewhere, and whether the load is asynchronous (the request
	// waits in WAITING_FOR_REMOTE_KVS until UpdateFromConnector reports it
	// in finished_recving) or synchronous (the worker half loads it in the
	// step before the model runs). async must be false when n is 0. It may
	// be called several times for one request (each time the request is
	// admitted with no KV) and must not change state. ErrRetryLater skips
	// the request for this step; any other error finishes it with
	// FINISHED_ERROR. A larger local hit must never turn "no asynchronous
	// load" into one (a connector loads at most what the hit does not
	// cover): with the step's token budget or seats spent, the scheduler
	// asks with numLocalComputed 0 first and passes a request offered no
	// asynchronous load there without looking up its prefix.
	GetNumNewMatchedTokens(r *Request, numLocalComputed int) (n int, async bool, err error)

	// UpdateStateAfterAlloc is called after blocks were allocated for a
	// request admitted with numExternal tokens to load (possibly 0: a full
	// local hit, where a P/D connector tells the remote side it can free).
	// blocks covers the local hit followed by the blocks to load into.
	UpdateStateAfterAlloc(r *Request, blocks []int32, numExternal int)

	// BuildConnectorMeta is called at the end of every Schedule with the
	// step's output and returns what the worker half needs this step (loads
	// to start, requests to release or notify); the scheduler puts it in
	// Output.ConnectorMeta untouched. It resets the connector's per-step
	// staging state. Nil means nothing for the worker half this step.
	BuildConnectorMeta(out *Output) ConnectorMeta

	// RequestFinished is called exactly once when a request finishes (any
	// finish status), before its blocks are freed. delayFree keeps the
	// blocks until the request id is reported in finished_sending; params
	// are returned to the client (kv_transfer_params, a JSON object).
	RequestFinished(r *Request, blockIDs []int32) (delayFree bool, params json.RawMessage)
}

// ConnectorMeta is what a connector's scheduler half hands its worker half
// for one step (vLLM's KVConnectorMetadata). The scheduler and the engine
// carry it from BuildConnectorMeta to the worker half without looking
// inside. It is the step's work itself, which Start runs, so the worker
// half reads no fields through a type assertion and the compiler checks
// what is handed over.
type ConnectorMeta interface {
	// Start starts the step's transfers (loads, notifications,
	// cancellations). The worker half calls it on the step loop, before
	// the model runs.
	Start()
}

// ErrRetryLater is returned by Connector.GetNumNewMatchedTokens when it
// cannot tell yet how many tokens it can load (vLLM's None); the request is
// skipped this step and asked about again in the next one.
var ErrRetryLater = errors.New("sched: connector not ready for this request yet")

// NoConnector is the connector of a standalone engine: nothing is ever
// loaded from elsewhere and blocks are freed as soon as a request finishes.
type NoConnector struct{}

// OnNewRequest does nothing.
func (NoConnector) OnNewRequest(*Request) {}

// GetNumNewMatchedTokens reports no external tokens.
func (NoConnector) GetNumNewMatchedTokens(*Request, int) (int, bool, error) { return 0, false, nil }

// UpdateStateAfterAlloc does nothing.
func (NoConnector) UpdateStateAfterAlloc(*Request, []int32, int) {}

// BuildConnectorMeta returns nil.
func (NoConnector) BuildConnectorMeta(*Output) ConnectorMeta { return nil }

// RequestFinished frees at once and returns no params.
func (NoConnector) RequestFinished(*Request, []int32) (bool, json.RawMessage) { return false, nil }

// LoadFailurePolicy says what happens to a request whose KV load from
// elsewhere failed for some blocks (vLLM's kv_load_failure_policy).
type LoadFailurePolicy string

const (
	// LoadFailureFail finishes the request with FINISHED_ERROR (HTTP 500,
	// retryable) and keeps the invalid blocks out of the prefix cache.
	LoadFailureFail LoadFailurePolicy = "fail"
	// LoadFailureRecompute keeps the valid prefix up to the first invalid
	// block and computes the rest locally.
	LoadFailureRecompute LoadFailurePolicy = "recompute"
)
