package engine

import (
	"github.com/tandem-serve/tandem/internal/kvparams"
	"github.com/tandem-serve/tandem/internal/sched"
)

// KVCompletions are what the worker half of a KV connector observed since it
// last reported: async loads that ended (successfully or not), held blocks
// the remote side no longer needs, and blocks whose load failed.
type KVCompletions struct {
	FinishedRecving []string
	FinishedSending []string
	InvalidBlocks   []int32
	// LoadErrors says, by request id, why a load in FinishedRecving failed;
	// a request the fail policy ends carries it in its error.
	LoadErrors map[string]string

	checked bool // already through checkLoads (a delayed load reported again)
}

func (c KVCompletions) empty() bool {
	return len(c.FinishedRecving)+len(c.FinishedSending)+len(c.InvalidBlocks)+len(c.LoadErrors) == 0
}

// KVWorker is the worker half of a KV connector (vLLM's start_load_kv plus
// get_finished), called by the step loop.
type KVWorker interface {
	// Step is called once per step, after scheduling and before the model
	// runs, with the scheduler connector's metadata for the step (nil when
	// it has none). It starts the step's asynchronous loads, completes its
	// synchronous ones before returning, and returns the completions
	// observed since the last call.
	// Completions that happen while the engine is idle are reported with
	// Engine.ReportKV instead, which wakes the loop.
	Step(meta sched.ConnectorMeta) (KVCompletions, error)
}

// MemoryReliever is implemented by a KVWorker that holds blocks it may give
// up early (a decode's conversation holds for the next turn). The step loop
// calls it, on the loop, when requests lack blocks: when the scheduler
// preempted a request, or can admit nothing while requests wait. It
// releases holds worth at least want blocks if it has them and returns the
// released requests as FinishedSending; new requests win over kept
// conversations.
type MemoryReliever interface {
	RelieveMemory(want int) KVCompletions
}

// KVRequestChecker is implemented by a KV connector (Config.Connector) that
// checks kv_transfer_params in Submit, before anything is allocated. Its
// methods are called from Submit's caller, on any goroutine.
type KVRequestChecker interface {
	// CheckKVTransfer returns an *InvalidRequestError for params this
	// engine cannot serve (inconsistent, issued for another prompt, or
	// asking for a role it does not have); else the most output tokens the
	// request may produce here (0 for no limit of its own, 1 for a prefill
	// whose decode runs elsewhere) and what the connector made of the
	// params, which the engine hands to the scheduler half as
	// sched.Request.KVParams without looking inside.
	CheckKVTransfer(kv *kvparams.Params, prompt []int32) (maxTokens int, parsed any, err error)
	// RejectedKVTransfer is called when the engine refuses a request that
	// carries kv params, for any reason, before the scheduler saw it, so the
	// connector can tell a remote engine holding KV for it to free it now.
	RejectedKVTransfer(kv *kvparams.Params)
}

// RejectKVTransfer tells the KV connector that a request carrying kv params
// was refused before the scheduler saw it (by Submit itself or by the API
// layer in front of it), so that a prefill holding blocks for it can free
// them at once.
func (e *Engine) RejectKVTransfer(kv *kvparams.Params) {
	if kc, ok := e.cfg.Connector.(KVRequestChecker); ok && kv != nil {
		kc.RejectedKVTransfer(kv)
	}
}

// ReportKV hands KV connector completions to the step loop and wakes it.
func (e *Engine) ReportKV(c KVCompletions) {
	if !c.empty() {
		e.in.post(c)
	}
}

// kvCompletions hands a KV connector's completions to the scheduler.
func (e *Engine) kvCompletions(c KVCompletions) {
	c = e.checkLoads(c)
	now := e.clock.Now()
	for _, id := range c.FinishedRecving {
		if rs := e.reqs[id]; rs != nil && rs.loaded.IsZero() {
			rs.loaded = now
		}
	}
	for id, why := range c.LoadErrors {
		e.sched.NoteLoadError(id, why)
	}
	e.sched.UpdateFromConnector(c.FinishedRecving, c.FinishedSending, c.InvalidBlocks)
}
