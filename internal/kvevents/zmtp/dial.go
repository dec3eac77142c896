package zmtp

import (
	"context"
	"fmt"
)

// Dial connects a SUB or DEALER socket to addr (host:port) and runs the
// handshake within opts.HandshakeTimeout. The connection closes when ctx
// ends or on Close, whichever comes first.
func Dial(ctx context.Context, addr, sockType string, opts Options) (*Conn, error) {
	if sockType != SUB && sockType != DEALER {
		return nil, fmt.Errorf("zmtp: Dial makes SUB and DEALER sockets, not %q", sockType)
	}
	opts = opts.withDefaults()
	c, err := opts.Dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	z, err := Handshake(c, sockType, false, opts)
	if err != nil {
		stop()
		c.Close()
		return nil, err
	}
	z.stop = stop
	return z, nil
}
