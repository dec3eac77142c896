package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// Forwarder is what the engine needs of a model: the forward pass over a
// batch and the facts that size the KV pool and the sampler. *model.Model
// is the real one; internal/sim's Model is a simulated one that sleeps for
// the time a profile says and writes a checkable pattern into the KV cache.
type Forwarder interface {
	// Forward is model.Model.Forward. An error that is a model.SeqErrors
	// fails only the sequences it names; any other error fails the batch.
	Forward(seqs []model.Seq, pool []byte, layout kvlayout.Layout) ([][]float32, error)
	// VocabSize is the number of logits per token.
	VocabSize() int
	// MaxModelLen is the number of positions a sequence may use.
	MaxModelLen() int
	// KVLayout is the KV pool's layout with blockSize slots a block and
	// the model's default element type.
	KVLayout(blockSize int) kvlayout.Layout
	// KVLayoutOf is KVLayout with the element type dt.
	KVLayoutOf(blockSize int, dt kvlayout.ElemType) kvlayout.Layout
	// Fingerprint names the weights: engines that agree on it compute
	// the same KV for the same tokens (prefix-cache keys, the P/D
	// handshake).
	Fingerprint() string
	// GenerationConfig is the model's sampling defaults.
	GenerationConfig() model.GenerationConfig
	// Pool runs the step's sampling in parallel.
	Pool() *tensor.Pool
}

// LoadCheck is a KVChecker's verdict on one finished KV load.
type LoadCheck struct {
	// Bad lists blocks whose bytes are wrong; the load-failure policy
	// handles them as blocks whose transfer failed.
	Bad []int32
	// Err says why, for the request's error under the fail policy.
	Err error
	// Delay, for a load that checked out, makes the engine see it finish
	// that much later (a simulated slow transfer).
	Delay time.Duration
}

// KVChecker is implemented by a Forwarder that can tell whether KV written
// by someone else — a KV connector's pull from a prefill engine — is what
// it would have computed itself (internal/sim: the KV bytes are a pattern
// of token, position and layer). The engine asks it about every load a
// connector reports finished, before the scheduler uses the blocks, so a
// wrong block goes through the load-failure policy like a failed transfer.
type KVChecker interface {
	// CheckLoadedKV checks positions [0, len(tokens)) of a sequence with
	// block table blocks; it runs on the step loop.
	CheckLoadedKV(tokens, blocks []int32, pool []byte, layout kvlayout.Layout) LoadCheck
}

// checkLoads runs the Forwarder's KVChecker over the loads that c reports
// finished: a load with wrong blocks becomes a failed load (its blocks in
// InvalidBlocks, the reason in LoadErrors), a delayed one is held back and
// reported again later. Completions reported again are not checked twice.
func (e *Engine) checkLoads(c KVCompletions) KVCompletions {
	chk, ok := e.model.(KVChecker)
	if !ok || c.checked || len(c.FinishedRecving) == 0 {
		return c
	}
	recving := c.FinishedRecving[:0:0]
	for _, id := range c.FinishedRecving {
		rs := e.reqs[id]
		if _, failed := c.LoadErrors[id]; failed || rs == nil || rs.sr.Status() != sched.WaitingForRemoteKVs || len(rs.sr.Prompt) < 2 {
			recving = append(recving, id)
			continue
		}
		// A remote prefill's load covers the prompt but its last token,
		// which the decode recomputes (kvconnector); the local prefix hit
		// before it is checked too, which costs little.
		v := chk.CheckLoadedKV(rs.sr.Prompt[:len(rs.sr.Prompt)-1], rs.sr.Blocks(), e.pool.Data(), e.layout)
		switch {
		case len(v.Bad) > 0:
			if c.LoadErrors == nil {
				c.LoadErrors = make(map[string]string)
			}
			why := "the KV check found wrong bytes"
			if v.Err != nil {
				why = v.Err.Error()
			}
			c.LoadErrors[id] = why
			c.InvalidBlocks = append(slices.Clip(c.InvalidBlocks), v.Bad...)
			e.log.Warn("loaded KV failed the check", "request_id", rs.ext, "blocks", v.Bad, "err", why)
			recving = append(recving, id)
		case v.Delay > 0:
			time.AfterFunc(v.Delay, func() {
				e.in.post(KVCompletions{FinishedRecving: []string{id}, checked: true})
			})
		default:
			recving = append(recving, id)
		}
	}
	c.FinishedRecving = recving
	return c
}

// failSeqs fails the requests of the sequences a model.SeqErrors names and
// returns the rest of the batch with their logits.
func (e *Engine) failSeqs(batch []sched.Scheduled, logits [][]float32, err error) ([]sched.Scheduled, [][]float32, bool) {
	var se model.SeqErrors
	if !errors.As(err, &se) || len(logits) != len(batch) {
		return batch, logits, false
	}
	keep, keepLogits := batch[:0:0], logits[:0:0]
	for i, sc := range batch {
		if serr, failed := se[i]; failed {
			e.log.Error("model forward failed for a request", "request_id", sc.Req.ID, "err", serr)
			e.sched.Fail(sc.Req.ID, fmt.Sprintf("model forward failed: %v", serr))
			continue
		}
		keep, keepLogits = append(keep, sc), append(keepLogits, logits[i])
	}
	return keep, keepLogits, true
}
