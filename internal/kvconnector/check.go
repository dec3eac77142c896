package kvconnector

import (
	"errors"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvparams"
	"github.com/tandem-serve/tandem/internal/kvxfer"
)

// The API edge: kv_transfer_params, parsed by the API layer, are checked in
// Submit, and released on a proxy's request, before anything else sees
// them.

// CheckKVTransfer implements engine.KVRequestChecker: it refuses params
// inconsistent with the prompt or issued for another one, and a role this
// engine does not have, and limits a prefill for remote decode to one
// output token. What it makes of the params (a kvRequest) rides on the
// request to OnNewRequest, so nothing is checked twice.
func (c *Connector) CheckKVTransfer(kv *kvparams.Params, prompt []int32) (int, any, error) {
	if !c.started {
		return 0, nil, errors.New("kvxfer: connector not started: call Start before submitting requests")
	}
	k, err := parseKV(*kv, len(prompt), c.blockSize, c.windows, c.cfg.Bidirectional)
	if err != nil {
		return 0, nil, err
	}
	switch {
	case k.remoteDecode && !c.cfg.Role.prefills():
		return 0, nil, invalid("do_remote_decode asks this engine to prefill for a remote decode, but it runs with --role %s: send the prefill leg to an engine started with --role prefill or --role both", c.cfg.Role)
	case k.remote != nil && !k.remoteDecode && !c.cfg.Role.decodes():
		return 0, nil, invalid("do_remote_prefill asks this engine to decode with KV pulled from a prefill engine, but it runs with --role %s: send the decode leg to an engine started with --role decode or --role both", c.cfg.Role)
	}
	if k.remote != nil {
		reason, err := c.authorize(k)
		if errors.Is(err, kvxfer.ErrSignatureExpired) {
			// Genuine params that came after their expiry: the issuer's
			// hold has ended, so nothing is dialed, and the load fails at
			// once for the load-failure policy to decide (compute the
			// prompt here, or fail saying the params expired).
			k.expired, err = err, nil
		}
		if err == nil && !k.remoteDecode {
			if err = c.bindPrompt(k, prompt); err != nil {
				reason = rejectedOtherPrompt
				if !errors.Is(err, errOtherPrompt) {
					reason = rejectedBadSignature
				}
			}
		}
		if err != nil {
			c.countRejected(reason)
			c.log.Warn("refused kv_transfer_params before dialing or allocating anything", "remote_engine_id", k.remote.EngineID,
				"remote_addr", k.remote.Peer().Addr(), "reason", reason, "err", err)
			if errors.Is(err, errOtherPrompt) {
				return 0, nil, invalid("kv_transfer_params were issued for another prompt: the decode leg must send exactly the prompt (the same tokens) of the prefill leg that returned them")
			}
			return 0, nil, &engine.InvalidRequestError{Param: kvParam,
				Message: "kv_transfer_params were not issued by an engine of this cluster (unsigned, altered, or naming a peer this engine may not contact): pass the engine's kv_transfer_params verbatim; this engine's log says which check failed"}
		}
		if k.expired != nil {
			c.countRejected(rejectedExpired)
			c.log.Warn("kv_transfer_params expired before this leg arrived: nothing is pulled, the load-failure policy decides", "remote_engine_id", k.remote.EngineID,
				"remote_addr", k.remote.Peer().Addr(), "reason", rejectedExpired, "err", k.expired)
		}
	}
	if k.remoteDecode {
		return 1, k, nil
	}
	return 0, k, nil
}

// authorize decides whether a remote prefill's params may make this engine
// dial: with a cluster secret they must carry a valid signature over every
// field the pull uses (and the tokens' digest); with or without one, the
// peer must pass the address allowlist, if any. Nothing is dialed or
// allocated before this passes. A refusal comes with its reason label for
// tandem:kv_params_rejected_total; genuine params past their expiry wrap
// kvxfer.ErrSignatureExpired.
func (c *Connector) authorize(k kvRequest) (string, error) {
	if c.cons == nil {
		return rejectedBadSignature, errors.New("this engine pulls no KV")
	}
	if c.cfg.Secret.IsSet() {
		if err := c.signer.Verify(k.grant(), k.signature, c.cfg.Clock.Now()); err != nil {
			if errors.Is(err, kvxfer.ErrSignatureExpired) {
				return rejectedExpired, err
			}
			return rejectedBadSignature, err
		}
	}
	if err := c.cons.CheckPeer(k.remote.Peer()); err != nil {
		return rejectedPeer, err
	}
	return "", nil
}

// Reasons kv_transfer_params are refused, the reason label of
// tandem:kv_params_rejected_total.
const (
	// rejectedExpired: genuinely signed, but past their expiry (plus the
	// clock-skew allowance): the leg came after the issuer's hold ended.
	// The request is not refused; it loads nothing and the load-failure
	// policy decides.
	rejectedExpired = "expired"
	// rejectedBadSignature: unsigned, altered, or signed with another
	// secret (or no digest of the prompt).
	rejectedBadSignature = "bad_signature"
	// rejectedPeer: the named peer is outside --kv-peers.
	rejectedPeer = "peer_not_allowed"
	// rejectedOtherPrompt: issued for another prompt (its digest differs).
	rejectedOtherPrompt = "other_prompt"
)

// countRejected counts params refused (or, expired, not used) for reason.
func (c *Connector) countRejected(reason string) {
	if m := c.cfg.Metrics; m != nil {
		m.KVParamsRejected.WithLabelValues(reason).Inc()
	}
}

// RejectedKVTransfer implements engine.KVRequestChecker: when a decode leg
// is refused before admission, the prefill holding its KV is told to free
// it now rather than at lease expiry — only when the params pass the same
// checks a pull would (authorize), so a refused client cannot make this
// engine dial anything either.
func (c *Connector) RejectedKVTransfer(kv *kvparams.Params) {
	if c.cons == nil || kv == nil {
		return
	}
	k, err := parseKV(*kv, kv.RemoteNumTokens, max(c.blockSize, 1), c.windows, c.cfg.Bidirectional)
	if err != nil || k.remote == nil {
		return
	}
	if _, err := c.authorize(k); err != nil {
		return // nobody we may tell
	}
	c.goNotify(notifyJob{peer: k.remote.Peer(), reqID: k.remote.RequestID})
}

// ReleaseKV frees the KV this prefill holds for the params it returned, at
// once, for a proxy whose decode leg never started (client gone, no decode
// reachable, decode refused). The params must carry this engine's own
// signature, so only whoever received them can release. Errors: an
// *engine.InvalidRequestError for params that are not this engine's, or
// one wrapping kvxfer.ErrNotHeld when nothing is held for them (any more).
func (c *Connector) ReleaseKV(kv kvparams.Params) error {
	if c.prod == nil {
		return &engine.InvalidRequestError{Param: kvParam, Message: "this engine does not prefill for remote decodes (--role decode): it holds no KV to release"}
	}
	if kv.RemoteNumTokens == 0 {
		return invalid("remote_num_tokens is required to release KV: pass the prefill's kv_transfer_params verbatim")
	}
	k, err := parseKV(kv, kv.RemoteNumTokens, c.blockSize, c.windows, true)
	if err == nil && (k.remote == nil || k.remote.EngineID != c.cfg.EngineID) {
		err = invalid("these kv_transfer_params do not name KV held by this engine")
	}
	if err == nil {
		if verr := c.signer.Verify(k.grant(), k.signature, c.cfg.Clock.Now()); verr != nil {
			c.log.Warn("refused a KV release", "err", verr)
			err = invalid("kv_transfer_params are not signed by this engine")
		}
	}
	if err != nil {
		return err
	}
	err = c.prod.Release(k.remote.RequestID)
	c.updateHoldGauge()
	return err
}
