package sched

import "github.com/tandem-serve/tandem/internal/kvcache"

// Status is a request's scheduling state. See the package documentation for
// the transitions.
type Status int

const (
	// Waiting: queued, no KV computed (or KV loaded and ready to run).
	Waiting Status = iota
	// WaitingForRemoteKVs: blocks allocated, the connector is loading KV
	// into them.
	WaitingForRemoteKVs
	// Running: in the batch.
	Running
	// Preempted: evicted from the batch to free blocks; queued at the front
	// and recomputed from scratch.
	Preempted
	// FinishedStopped: EOS, a stop token or a stop string.
	FinishedStopped
	// FinishedLength: the output reached its maximum length.
	FinishedLength
	// FinishedAborted: the client went away or the request was aborted.
	FinishedAborted
	// FinishedError: the request failed (cannot fit, KV load failed, ...).
	FinishedError
)

var statusNames = [...]string{
	Waiting:             "WAITING",
	WaitingForRemoteKVs: "WAITING_FOR_REMOTE_KVS",
	Running:             "RUNNING",
	Preempted:           "PREEMPTED",
	FinishedStopped:     "FINISHED_STOPPED",
	FinishedLength:      "FINISHED_LENGTH",
	FinishedAborted:     "FINISHED_ABORTED",
	FinishedError:       "FINISHED_ERROR",
}

// String returns vLLM's name of the status.
func (s Status) String() string {
	if s >= 0 && int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "UNKNOWN"
}

// Finished reports whether s is a final status.
func (s Status) Finished() bool { return s >= FinishedStopped }

// Request is one request as the scheduler sees it. The exported fields are
// set by the caller before Add and not changed afterwards; the rest is
// scheduler state, read through methods.
type Request struct {
	// ID is unique among the scheduler's live requests.
	ID string
	// Prompt is the prompt's token ids (not empty).
	Prompt []int32
	// MaxTokens bounds the output length; the request finishes with
	// FINISHED_LENGTH when it is reached, if the caller did not stop it
	// before. It must be positive.
	MaxTokens int
	// KVParams is the request's kv_transfer_params as the connector parsed
	// them when the request was submitted (engine.KVRequestChecker), nil for
	// a request without any. The connector owns the value: the scheduler
	// only carries it to the connector's methods.
	KVParams any

	status Status
	tokens []int32 // prompt then output
	// numComputed tokens of tokens have their KV in tables.
	numComputed int
	// tables are the block tables, one per KV-cache group
	// (Config.GroupWindows), all of one length: tables[g][i] holds
	// positions [i·BlockSize, (i+1)·BlockSize) of group g's layers, or
	// kvlayout.NullBlock in a sliding-window group for a block its window
	// has passed. nil while the request holds no block.
	tables [][]int32
	// hashes of the full blocks of tokens computed so far (grows lazily).
	hashes []kvcache.BlockHash
	// numCachedBlocks leading blocks are registered in the prefix cache (or
	// were refused as duplicates) and need no more caching.
	numCachedBlocks int

	numCachedTokens   int // local prefix hit at first admission, -1 before
	numExternalTokens int // tokens loaded by the connector
	numPreemptions    int

	// A load in progress (async) or done in this step (sync): tokens
	// [loadStart, loadEnd) are written by the connector.
	loadStart, loadEnd int
	syncLoad           bool
	// firstInvalid is the index in the block table of the first block reported
	// invalid during the current load, -1 if none.
	firstInvalid int
	// loadErr is why the current load failed, as the connector explained
	// it (NoteLoadError), for the FINISHED_ERROR message.
	loadErr string
	// discard marks a running request whose result this step is void (a
	// sync load failed under it).
	discard bool

	// fetch is the stage of a KV fetch from a remote engine.
	fetch FetchStage

	// Held after finishing: waiting for finished_recving / finished_sending.
	holdRecv, holdSend bool
	errMsg             string
}

// FetchStage is where a request whose KV comes from a remote engine is on
// its way to running (the stage label of
// vllm:num_requests_kv_fetch_by_stage).
type FetchStage int

const (
	// FetchNone: no fetch pending (none offered, or the request runs).
	FetchNone FetchStage = iota
	// FetchWaitingToStart: the connector offered a load that has not
	// started: the loads' bounds or memory hold it back.
	FetchWaitingToStart
	// FetchInProgress: WAITING_FOR_REMOTE_KVS.
	FetchInProgress
	// FetchCompletedWaiting: loaded, waiting to be scheduled.
	FetchCompletedWaiting
)

var fetchStageNames = [...]string{FetchNone: "", FetchWaitingToStart: "waiting_to_start", FetchInProgress: "in_progress", FetchCompletedWaiting: "completed_waiting"}

// String returns the stage's metric label ("" for FetchNone).
func (f FetchStage) String() string {
	if f >= 0 && int(f) < len(fetchStageNames) {
		return fetchStageNames[f]
	}
	return "unknown"
}

// FetchStages lists the stages a fetch goes through, in order.
var FetchStages = []FetchStage{FetchWaitingToStart, FetchInProgress, FetchCompletedWaiting}

// FetchStage returns the request's KV fetch stage.
func (r *Request) FetchStage() FetchStage {
	if r.status == WaitingForRemoteKVs {
		return FetchInProgress
	}
	if r.status != Waiting && r.status != Preempted {
		return FetchNone
	}
	return r.fetch
}

// Status returns the request's state.
func (r *Request) Status() Status { return r.status }

// Output returns the tokens sampled so far. The slice must not be modified.
func (r *Request) Output() []int32 { return r.tokens[len(r.Prompt):] }

// NumTokens returns the prompt plus output length.
func (r *Request) NumTokens() int { return len(r.tokens) }

// NumComputedTokens returns how many tokens have their KV in the request's
// blocks.
func (r *Request) NumComputedTokens() int { return r.numComputed }

// Blocks returns the request's block table of KV-cache group 0 (with one
// group, its only table; nil while it holds no block). The slice must not
// be modified.
func (r *Request) Blocks() []int32 {
	if r.tables == nil {
		return nil
	}
	return r.tables[0]
}

// Tables returns the request's block tables, one per KV-cache group (nil
// while it holds no block). The slices must not be modified.
func (r *Request) Tables() [][]int32 { return r.tables }

// hasBlocks reports whether r holds a block table (possibly of null
// entries only, in a sliding-window group).
func (r *Request) hasBlocks() bool { return len(r.tables) > 0 && len(r.tables[0]) > 0 }

// NumCachedTokens returns the prompt tokens found in the local prefix cache
// when the request was first admitted (0 before).
func (r *Request) NumCachedTokens() int { return max(r.numCachedTokens, 0) }

// NumExternalTokens returns the prompt tokens whose KV the connector loaded.
func (r *Request) NumExternalTokens() int { return r.numExternalTokens }

// NumPreemptions returns how many times the request was preempted.
func (r *Request) NumPreemptions() int { return r.numPreemptions }

// Err returns the reason of a FINISHED_ERROR.
func (r *Request) Err() string { return r.errMsg }

// Discarded reports that this step's work for a running request is void: a
// synchronous KV load under it failed and the scheduler will recompute from
// the first invalid block. The caller must not run or sample it this step.
func (r *Request) Discarded() bool { return r.discard }

func (r *Request) decoding() bool { return r.numComputed >= len(r.Prompt) }
