// Package conditional is the "conditional" disaggregation decider: a remote
// prefill only when it pays. The rules, in order:
//
//  1. prompt tokens >= MustRemote (when set) → remote, reason=must_remote
//     (strong prefill / weak decode hardware, Dynamo PR #853);
//  2. no prefill engine free (all unhealthy or saturated) → local,
//     reason=prefill_saturated;
//  3. the decode's fresh KV usage >= DecodeKVPressure (when set) → remote,
//     reason=decode_kv_pressure (a local prefill would crowd its decodes);
//  4. uncached prompt tokens on the chosen decode (prompt minus its prefix
//     hit) < Threshold → local, reason=short_uncached (cached or short);
//  5. otherwise remote, reason=long_uncached.
//
// Token counts are exact when the router has the model's tokenizer and
// estimated otherwise.
package conditional

import "github.com/tandem-serve/tandem/internal/router"

// Name is the decider's name in the factory.
const Name = "conditional"

// Reasons.
const (
	MustRemote       = "must_remote"
	PrefillSaturated = "prefill_saturated"
	DecodeKVPressure = "decode_kv_pressure"
	ShortUncached    = "short_uncached"
	LongUncached     = "long_uncached"
)

// Decider decides on uncached length and load.
type Decider struct {
	// Threshold is the uncached prompt tokens from which a remote prefill
	// pays. Default 256 when <= 0.
	Threshold int
	// MustRemote is the prompt length that always goes remote (0: off).
	MustRemote int
	// DecodeKVPressure is the decode KV usage (0..1) above which prefill is
	// sent away (0: off).
	DecodeKVPressure float64
}

// Decide implements router.Decider.
func (d *Decider) Decide(in router.DecideInput) router.Decision {
	prompt := in.Req.PromptTokens
	if d.MustRemote > 0 && prompt >= d.MustRemote && in.PrefillHealthy > 0 {
		return router.Decision{Remote: true, Reason: MustRemote}
	}
	if in.PrefillFree == 0 {
		return router.Decision{Reason: PrefillSaturated}
	}
	if d.DecodeKVPressure > 0 && in.Decode.Scraped && in.Decode.KVUsage >= d.DecodeKVPressure {
		return router.Decision{Remote: true, Reason: DecodeKVPressure}
	}
	th := d.Threshold
	if th <= 0 {
		th = 256
	}
	cached := 0
	if in.Req.BlockSize > 0 {
		cached = in.Decode.PrefixBlocks * in.Req.BlockSize
	}
	if prompt-cached < th {
		return router.Decision{Reason: ShortUncached}
	}
	return router.Decision{Remote: true, Reason: LongUncached}
}
