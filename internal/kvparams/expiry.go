package kvparams

import (
	"math"
	"time"
)

// MinUnixExpiry is the smallest remote_blocks_expiry_time read as Unix
// seconds (1e9 s is September 2001).
//
// The field is written on two clocks. Tandem's decodes write Unix seconds,
// which any host reads without help. vLLM's decodes (bidirectional NIXL
// mode) write their own time.perf_counter() deadline: seconds on the
// decode host's monotonic clock, whose zero is that host's boot, so a value
// well under 1e9 (31 years of uptime). A vLLM prefill converts it with the
// clock offset it measured in its NIXL handshake with that decode; nothing
// else knows that offset. Read as Unix seconds it would be in 1970, every
// hold expired on arrival; read against the reader's own monotonic clock it
// would be off by the two hosts' uptime difference.
const MinUnixExpiry = 1e9

// UnixExpiry returns remote_blocks_expiry_time as a time when it is in
// Unix seconds (at least MinUnixExpiry). It returns false when the field is
// absent or is a peer's monotonic deadline (a vLLM decode's), which only the
// peer's own handshake partner can place: the caller then falls back to its
// own hold duration counted from when it received the params, which is
// what such a decode counted from. The params keep the value verbatim
// either way, so a vLLM prefill still receives the deadline it can read.
func (p *Params) UnixExpiry() (time.Time, bool) {
	// The last second time.Unix takes in nanoseconds without overflow.
	const maxSec = math.MaxInt64 / 1_000_000_000
	e := p.RemoteBlocksExpiryTime
	if !(e >= MinUnixExpiry) {
		return time.Time{}, false
	}
	if e >= maxSec {
		return time.Unix(maxSec, 0), true
	}
	sec, frac := math.Modf(e)
	return time.Unix(int64(sec), int64(frac*1e9)), true
}
