package kvconnector

import (
	"encoding/json"
	"time"

	"github.com/tandem-serve/tandem/internal/kvlayout"
	"github.com/tandem-serve/tandem/internal/kvparams"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/logid"
	"github.com/tandem-serve/tandem/internal/sched"
)

// The scheduler half: what to load for a request, and what to hold when it
// finishes. These run on the engine's step loop.

// OnNewRequest implements sched.Connector: it records the request's kv
// params, as CheckKVTransfer parsed them at Submit, and, for a remote
// prefill, starts heartbeating the prefill's lease while the request queues
// here.
func (c *Connector) OnNewRequest(r *sched.Request) {
	k, ok := r.KVParams.(kvRequest)
	if !ok || !c.started {
		return
	}
	switch {
	case k.remoteDecode && k.remote != nil && c.prod != nil && c.cons != nil:
		// Turn 2 on a prefill: pull the history's KV (what of it is a
		// prefix of this prompt), then hold the prompt for the decode leg.
		// No heartbeats: the decode's hold is fixed (turn 2 is
		// client-driven).
		st := &connReq{remoteDecode: true, remote: k.remote, history: true, expired: k.expired, groups: k.groups, remoteTokens: k.numTokens}
		st.pullable = min(matchedTokens(c.cfg.ModelFingerprint, r.Prompt, k.numTokens, k.history, c.blockSize), len(r.Prompt)-1)
		if limit := verifiableTokens(len(r.Prompt), k.numTokens, c.blockSize); st.pullable < limit {
			st.recompute = reasonMismatch
			// r.ID is about to be held for the decode leg: a tag of it.
			c.log.Info("conversation history differs from the held KV; recomputing from the first difference",
				append(logid.Attrs(c.log, "id", r.ID), "held_tokens", k.numTokens, "matching_tokens", st.pullable)...)
		}
		if !c.windowHeld(k.groups, k.numTokens, st.pullable) {
			// A sliding-window group held only its window's tail, and
			// computing on from the first difference needs blocks
			// before it.
			st.pullable, st.recompute = 0, reasonOutsideWindow
		}
		c.reqs[r.ID] = st
	case k.remoteDecode && c.prod != nil:
		c.reqs[r.ID] = &connReq{remoteDecode: true}
	case k.remote != nil && c.cons != nil:
		c.reqs[r.ID] = &connReq{remote: k.remote, pullable: len(r.Prompt) - 1, expired: k.expired, groups: k.groups, remoteTokens: k.numTokens}
		if k.expired == nil {
			c.cons.Watch(k.remote.Peer(), k.remote.RequestID)
		}
	}
}

// GetNumNewMatchedTokens implements sched.Connector: the remote tokens
// after the local prefix hit load asynchronously — for a decode leg the
// prompt except its last token (recomputed to sample the first output
// token), for a turn-2 prefill the held history that is a prefix of the
// prompt, unless it is below the recompute threshold.
func (c *Connector) GetNumNewMatchedTokens(r *sched.Request, numLocalComputed int) (int, bool, error) {
	st := c.reqs[r.ID]
	if st == nil || st.remote == nil || st.phase != waitingForAlloc {
		return 0, false, nil
	}
	n := st.pullable - numLocalComputed
	if n <= 0 || st.history && n < c.cfg.RecomputeThreshold {
		return 0, false, nil
	}
	return n, true, nil
}

// UpdateStateAfterAlloc implements sched.Connector: it stages the pull of
// the remote blocks that the local prefix hit does not cover, or, when
// nothing is to be pulled, a notification that frees them on the prefill.
func (c *Connector) UpdateStateAfterAlloc(r *sched.Request, blocks []int32, numExternal int) {
	st := c.reqs[r.ID]
	if st == nil || st.remote == nil || st.phase != waitingForAlloc {
		return
	}
	if numExternal == 0 {
		st.phase = consumed
		if st.history {
			c.countRecompute(st, r, r.NumComputedTokens())
		}
		c.notify(st)
		return
	}
	bs := c.blockSize
	local := r.NumComputedTokens()
	first, last := local/bs, (local+numExternal+bs-1)/bs
	st.phase = loading
	job := pullJob{id: r.ID, params: *st.remote, expired: st.expired}
	if st.history {
		job.history = &historyPull{tokens: numExternal, recompute: st.recompute}
	}
	// Every group's blocks of the load, a sliding-window group's from its
	// window on (the scheduler left the entries before it null). The
	// pairs exist by construction (the lists were validated against the
	// prompt, the scheduler allocated for local+numExternal); a request
	// that breaks that fails its load instead of reading past a slice.
	tables := r.Tables()
	if tables == nil {
		tables = [][]int32{blocks}
	}
	if remote, dst, ok := pullPairs(st.groups, tables, st.remoteTokens, bs, first, last); ok {
		job.params.BlockIDs, job.blocks = remote, dst
	} else {
		job.params.BlockIDs = nil
		job.blocks = blocks[min(first, len(blocks)):]
	}
	c.staged.pulls = append(c.staged.pulls, job)
}

// BuildConnectorMeta implements sched.Connector: it hands the staged pulls,
// notifications and cancellations to the worker half and resets them.
func (c *Connector) BuildConnectorMeta(*sched.Output) sched.ConnectorMeta {
	if c.staged.empty() {
		return nil
	}
	m := c.staged
	m.c = c
	c.staged = connMeta{}
	return &m
}

// notify stages telling the holder of st's remote KV that this engine will
// not read it; not for expired params, whose hold has ended.
func (c *Connector) notify(st *connReq) {
	if st.expired == nil {
		c.staged.notifies = append(c.staged.notifies, notifyJob{peer: st.remote.Peer(), reqID: st.remote.RequestID})
	}
}

// RequestFinished implements sched.Connector. A prefill for a remote decode
// that finished normally holds its prompt blocks under a lease and returns
// the params the decode needs; aborted or failed, it frees at once. A
// remote prefill that ends before pulling tells the prefill to free; one
// that ends while pulling cancels the pull (the scheduler keeps its blocks
// until the pull reports, and the pull's DONE frees the prefill's).
func (c *Connector) RequestFinished(r *sched.Request, blockIDs []int32) (bool, json.RawMessage) {
	st := c.reqs[r.ID]
	if st == nil {
		return false, nil
	}
	delete(c.reqs, r.ID)
	if st.remote != nil {
		switch st.phase {
		case waitingForAlloc:
			c.notify(st)
		case loading:
			c.staged.cancels = append(c.staged.cancels, r.ID)
		}
	}
	if s := r.Status(); s != sched.FinishedStopped && s != sched.FinishedLength {
		return false, nil
	}
	switch {
	case st.remoteDecode:
		return c.holdForDecode(r, blockIDs)
	case c.cfg.Bidirectional && c.prod != nil:
		return c.holdConversation(r, blockIDs)
	}
	return false, nil
}

// holdForDecode holds a finished prefill's prompt blocks under a lease for
// the decode leg and returns the params the decode needs.
func (c *Connector) holdForDecode(r *sched.Request, blockIDs []int32) (bool, json.RawMessage) {
	groups, ok := c.leadingBlocks(r, blockIDs, len(r.Prompt))
	if !ok {
		return false, nil
	}
	ids := flatten(groups)
	now := c.cfg.Clock.Now()
	if err := c.prod.Hold(r.ID, ids, now); err != nil {
		c.log.Error("cannot hold KV for the remote decode; freeing it", "id", r.ID, "err", err)
		return false, nil
	}
	digest := kvparams.PromptDigest(c.cfg.ModelFingerprint, r.Prompt)
	g := kvxfer.Grant{EngineID: c.cfg.EngineID, RequestID: r.ID, Host: c.advertHost, Port: c.advertPort, BlockIDs: ids, NumTokens: len(r.Prompt), Digest: digest}
	p := c.params(g, groups, now.Add(c.cfg.Lease))
	p.DoRemotePrefill = true
	p.PromptDigest = digest
	return true, p.Raw()
}

// holdConversation holds a finished decode leg's blocks — every token with
// KV, prompt and output, all but the last sampled — for DecodeHoldTTL, not
// renewed by heartbeats, so the next turn's prefill can pull them (vLLM's
// bidirectional mode), and returns the params that name them, with the
// token hash chain the prefill checks its prompt against.
func (c *Connector) holdConversation(r *sched.Request, blockIDs []int32) (bool, json.RawMessage) {
	n := r.NumComputedTokens()
	groups, ok := c.leadingBlocks(r, blockIDs, n)
	if !ok || n == 0 {
		return false, nil
	}
	ids := flatten(groups)
	now := c.cfg.Clock.Now()
	deadline := now.Add(c.cfg.DecodeHoldTTL)
	if err := c.prod.HoldFor(r.ID, ids, now, c.cfg.DecodeHoldTTL, true); err != nil {
		c.log.Error("cannot hold the conversation's KV for its next turn; freeing it", "id", r.ID, "err", err)
		return false, nil
	}
	tokens := append(append(make([]int32, 0, len(r.Prompt)+len(r.Output())), r.Prompt...), r.Output()...)[:n]
	chain := historyChain(c.cfg.ModelFingerprint, tokens, c.blockSize)
	g := kvxfer.Grant{EngineID: c.cfg.EngineID, RequestID: r.ID, Host: c.advertHost, Port: c.advertPort, BlockIDs: ids, NumTokens: n, Digest: chainDigest(chain)}
	p := c.params(g, groups, deadline)
	p.DoRemoteDecode = true
	p.RemoteBlocksExpiryTime = float64(deadline.UnixNano()) / 1e9
	p.History = chain
	c.updateHoldGauge()
	return true, p.Raw()
}

// leadingBlocks returns, per KV-cache group, the ids of the blocks holding
// r's first n tokens that the exchange sends (a sliding-window group's
// clipped to its window: exchangeBlocks).
func (c *Connector) leadingBlocks(r *sched.Request, blockIDs []int32, n int) ([][]int, bool) {
	tables := r.Tables()
	if tables == nil {
		tables = [][]int32{blockIDs}
	}
	groups, ok := exchangeBlocks(tables, c.windows, n, c.blockSize)
	if !ok {
		c.log.Error("request finished without KV for the tokens to hold; freeing instead of holding", "id", r.ID, "blocks", len(blockIDs), "want", (n+c.blockSize-1)/c.blockSize)
		return nil, false
	}
	return groups, true
}

// windowHeld reports whether a load that ends at position pullable finds,
// in every sliding-window group of a hold of numTokens tokens whose lists
// are groups, the blocks its window reads from there on.
func (c *Connector) windowHeld(groups [][]int, numTokens, pullable int) bool {
	if pullable <= 0 {
		return true
	}
	nb := (numTokens + c.blockSize - 1) / c.blockSize
	for g, ids := range groups {
		if kvlayout.FirstNeeded(window(c.windows, g), pullable)/c.blockSize < nb-len(ids) {
			return false
		}
	}
	return true
}

// params are the kv_transfer_params naming g's blocks on this engine (the
// concatenation of groups, one list per KV-cache group), signed until
// expiry, with every field vLLM's connector returns.
func (c *Connector) params(g kvxfer.Grant, groups [][]int, expiry time.Time) kvparams.Params {
	return kvparams.Params{
		Signature:      c.signer.Sign(g, expiry),
		RemoteBlockIDs: groups, RemoteEngineID: g.EngineID, RemoteRequestID: g.RequestID,
		RemoteHost: g.Host, RemotePort: g.Port, RemoteNumTokens: g.NumTokens,
		TPSize: 1, DCPSize: 1, PPSize: 1, TransferMode: "pull",
		RemoteRegistrationGeneration: c.prod.Info().Generation,
	}
}

// Reasons a turn-2 prefill computes (some of) the history instead of
// pulling it, the reason label of tandem:kv_history_recomputed_total. A
// history pull that fails counts under its kvxfer.FailureReason instead
// (expired, peer_restarted, not_held, io, ...).
const (
	reasonLocalHit        = "local_hit"                // the prefill's own prefix cache had it all: nothing to pull
	reasonBelowThreshold  = "below_threshold"          // fewer than --kv-recompute-threshold tokens to pull
	reasonMismatch        = "history_mismatch"         // the prompt's history differs from the held one in its first block
	reasonMismatchPartial = "history_mismatch_partial" // it differs later: the blocks before the edit were pulled
	reasonOutsideWindow   = "history_outside_window"   // a sliding-window group's held tail does not reach back to where computing resumes
)

// verifiableTokens is how many held tokens a prompt of promptLen tokens can
// take from a history of numTokens when every token agrees: the history
// chain checks whole blocks, and the history's last, partial block only
// when the prompt has all of it; and the prompt's last token is always
// computed (it samples the first output token). Fewer matching tokens mean
// the history was rewritten.
func verifiableTokens(promptLen, numTokens, blockSize int) int {
	n := numTokens
	if promptLen < numTokens {
		n = promptLen / blockSize * blockSize
	}
	return min(n, promptLen-1)
}

// countRecompute records why a turn-2 prefill pulled nothing.
func (c *Connector) countRecompute(st *connReq, r *sched.Request, local int) {
	reason := st.recompute
	switch {
	case reason != "":
	case st.pullable-local <= 0:
		reason = reasonLocalHit
	default:
		reason = reasonBelowThreshold
	}
	c.countHistory(reason)
	c.log.Debug("turn-2 prefill computes its history locally", "id", r.ID, "reason", reason, "local_tokens", local, "pullable", st.pullable)
}

// countHistory counts a turn-2 prefill that computed (some of) its history
// under reason.
func (c *Connector) countHistory(reason string) {
	if m := c.cfg.Metrics; m != nil {
		m.HistoryRecomputed.WithLabelValues(reason).Inc()
	}
}
