package kvxfer

import (
	"fmt"
	"net"
	"strconv"
	"time"
)

// Peer names a producer's side channel, as kv_transfer_params do.
type Peer struct {
	EngineID string
	Host     string
	Port     int
}

// Addr is the side channel's address, host:port, to dial.
func (p Peer) Addr() string { return net.JoinHostPort(p.Host, strconv.Itoa(p.Port)) }

// Validate reports an error, naming the kv_transfer_params fields to
// fix, when p lacks an engine id or a host or its port is outside 1-65535.
func (p Peer) Validate() error {
	if p.EngineID == "" || p.Host == "" || p.Port <= 0 || p.Port > 65535 {
		return fmt.Errorf("invalid remote engine (engine id %q, host %q, port %d): kv_transfer_params must carry remote_engine_id, remote_host and remote_port", p.EngineID, p.Host, p.Port)
	}
	return nil
}

// RemoteParams says where a request's prefilled KV is: the producer and its
// request id and block ids (kv_transfer_params' remote_* fields). For a
// partial local prefix hit, pass only the trailing blocks to pull.
type RemoteParams struct {
	EngineID  string
	RequestID string
	Host      string
	Port      int
	BlockIDs  []int
	// Generation, if non-zero, is the producer's registration generation
	// the params were issued under (Info.Generation): another generation
	// means the memory they name is gone.
	Generation uint64
	// Deadline, if set, is when the producer stops holding the blocks, in
	// the producer's clock (a decode's conversation hold). A pull that
	// would land within ExpiryMargin of it is declined with ErrExpired.
	Deadline time.Time
}

// ExpiryMargin is how close to a producer's stated deadline a pull is still
// attempted (vLLM's _KV_BLOCKS_EXPIRY_SAFETY_MARGIN).
const ExpiryMargin = 5 * time.Second

// Peer returns the producer part of r.
func (r RemoteParams) Peer() Peer { return Peer{EngineID: r.EngineID, Host: r.Host, Port: r.Port} }
