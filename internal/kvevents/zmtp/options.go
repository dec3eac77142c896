package zmtp

import (
	"context"
	"log/slog"
	"net"
	"time"
)

// Options tune a socket or a connection; zero values take the defaults.
type Options struct {
	// HWM is a PubSocket's queue per peer, in messages: past it, that peer
	// misses messages (libzmq's per-peer high-water mark; default 1000).
	HWM int
	// MaxPeers bounds a listening socket's connections at once (default
	// DefaultMaxPeers); one more is closed as soon as it is accepted.
	MaxPeers int
	// MaxFrame bounds a message frame read (default MaxCommandSize).
	MaxFrame int64
	// HandshakeTimeout bounds the greeting and READY exchange (default
	// 5 s); WriteTimeout bounds each write (default 10 s).
	HandshakeTimeout, WriteTimeout time.Duration
	// Logger gets connection failures at debug level (default
	// slog.Default()).
	Logger *slog.Logger
	// Dial opens the TCP connections of Dial and DialPub (default a
	// net.Dialer bounded by HandshakeTimeout); tests dial in memory.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// DefaultMaxPeers is the default bound on a listening socket's connections.
const DefaultMaxPeers = 64

func (o Options) withDefaults() Options {
	if o.HWM <= 0 {
		o.HWM = 1000
	}
	if o.MaxPeers <= 0 {
		o.MaxPeers = DefaultMaxPeers
	}
	if o.MaxFrame <= 0 {
		o.MaxFrame = MaxCommandSize
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 5 * time.Second
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Dial == nil {
		d := net.Dialer{Timeout: o.HandshakeTimeout}
		o.Dial = d.DialContext
	}
	return o
}
