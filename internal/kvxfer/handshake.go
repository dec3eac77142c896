package kvxfer

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"time"
)

// The side channel's mutual authentication. Every connection opens with
//
//	D → P  HELLO      nonce_d (32 B)
//	P → D  CHALLENGE  nonce_p (32 B) | proof_p = HMAC(k, "producer" | nonce_d | nonce_p)
//	D → P  AUTH       proof_d = HMAC(k, "consumer" | nonce_d | nonce_p) | Info (consumer)
//	P → D  HELLO_ACK  Info (producer) | HMAC(k, "info" | nonce_d | nonce_p | Info bytes)
//
// k is the channel key derived from the cluster secret (Secret). Each side
// proves it knows k over the other side's fresh nonce, so neither a replay
// nor a reflection (the labels differ) passes; the consumer checks the
// producer's proof before it says anything about itself, and the producer
// says nothing about itself (engine id, pool file, host) before the
// consumer's proof checked out. The producer's Info is MACed too: whoever
// can alter bytes on the path still cannot point a decode at another pool
// file. Frames after the handshake carry no MAC; use TLS (--kv-tls-*) where
// the network path is not trusted.
//
// Until AUTH checked out the producer accepts only these frames, each at
// most maxPreAuthPayload bytes, HELLO within HelloTimeout of the accept and
// all within AuthTimeout; a byte that cannot open a frame ends the
// connection as soon as it arrives. How many connections may be at this
// stage, and who gives way to whom, is admission.go's.

const (
	nonceSize = 32
	macSize   = sha256.Size
	// maxPreAuthPayload bounds what an unauthenticated peer can make the
	// producer allocate per frame (a consumer's Info is ~200 bytes).
	maxPreAuthPayload = 4096
)

// DefaultAuthTimeout bounds a side-channel handshake, from accept to
// HELLO_ACK: a peer that dribbles bytes (slow loris) or says nothing is
// dropped after it.
const DefaultAuthTimeout = 3 * time.Second

func handshakeMAC(key []byte, label string, nd, np []byte, extra []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("tandem kv handshake " + label))
	m.Write(nd)
	m.Write(np)
	m.Write(extra)
	return m.Sum(nil)
}

func nonce() []byte {
	b := make([]byte, nonceSize)
	rand.Read(b)
	return b
}

// errAuth is what the producer tells a peer that failed authentication; it
// names nothing about this engine.
const errAuthMessage = "authentication failed: the decode and prefill engines must share one KV secret (--kv-secret-file or " + SecretEnv + ")"

// readPreAuth reads one frame of the handshake on the producer side: type
// want, payload at most maxPreAuthPayload bytes. The header is checked as
// its bytes arrive, so a peer sending anything but a frame, however
// slowly, is refused at its first wrong byte.
func readPreAuth(r io.Reader, hb *[headerSize]byte, want msgType) (header, []byte, error) {
	h, err := readHeaderEager(r, hb)
	if err != nil {
		return h, nil, err
	}
	if h.Type != want {
		return h, nil, fmt.Errorf("%w: %s before the handshake completed (want %s)", errBadFrame, h.Type, want)
	}
	if h.Len > maxPreAuthPayload {
		return h, nil, fmt.Errorf("%w: %s payload of %d bytes during the handshake (limit %d)", errBadFrame, h.Type, h.Len, maxPreAuthPayload)
	}
	p := make([]byte, h.Len)
	if _, err := io.ReadFull(r, p); err != nil {
		return h, nil, err
	}
	return h, p, nil
}

// readHeaderEager reads a frame header from a consumer like readHeader,
// the magic checked as its bytes arrive.
func readHeaderEager(r io.Reader, buf *[headerSize]byte) (header, error) {
	return readHeaderChecked(r, buf, func(b []byte) error {
		return fmt.Errorf("%w: bad magic %q (is something other than a tandem kv consumer connecting?)", errBadFrame, b[:min(len(b), len(magic))])
	})
}

// errNoSlot ends a connection that authenticated while every connection
// slot was taken (the peer was told busy).
var errNoSlot = errors.New("side-channel connection limit reached")

// authenticate runs the producer's side of the handshake. admit is called
// with the consumer's engine id once the consumer has proved the secret,
// and takes a connection slot; a non-empty answer refuses the connection
// as busy, with that message. On success the connection may send
// anything; on failure the caller closes it.
func (s *srvConn) authenticate(admit func(engineID string) string) error {
	p := s.p
	start := s.start
	if start.IsZero() {
		start = time.Now()
	}
	helloBy := p.cfg.HelloTimeout
	if helloBy <= 0 || helloBy > p.cfg.AuthTimeout {
		helloBy = p.cfg.AuthTimeout
	}
	s.c.SetDeadline(start.Add(helloBy))
	defer s.c.SetDeadline(time.Time{})
	h, nd, err := readPreAuth(s.c, &s.hb, msgHello)
	if err != nil {
		return err
	}
	if len(nd) != nonceSize {
		return fmt.Errorf("%w: HELLO carries %d bytes, want a %d-byte nonce", errBadFrame, len(nd), nonceSize)
	}
	p.helloRead(s.raw)
	s.c.SetDeadline(start.Add(p.cfg.AuthTimeout))
	key := p.cfg.Secret.channelKey()
	np := nonce()
	if err := s.send(frame(msgChallenge, h.Corr, func(b []byte) []byte {
		b = append(b, np...)
		return append(b, handshakeMAC(key, "producer", nd, np, nil)...)
	})); err != nil {
		return err
	}
	h, payload, err := readPreAuth(s.c, &s.hb, msgAuth)
	if err != nil {
		return err
	}
	if len(payload) < macSize || !hmac.Equal(payload[:macSize], handshakeMAC(key, "consumer", nd, np, nil)) {
		s.sendError(h.Corr, CodeUnauthenticated, errAuthMessage)
		return fmt.Errorf("%w: the consumer's proof does not match this engine's KV secret", ErrUnauthenticated)
	}
	in, err := decodeInfo(payload[macSize:])
	if err != nil {
		return err
	}
	s.remote = in.EngineID
	// Take a connection slot before answering, so a consumer that has its
	// HELLO_ACK holds a slot, and one refused learns it here, where it
	// retries with backoff.
	if why := admit(in.EngineID); why != "" {
		s.sendError(h.Corr, CodeBusy, why)
		return errNoSlot
	}
	now := p.info
	now.Clock = time.Now()
	info := appendInfo(nil, &now)
	if err := s.send(frame(msgHelloAck, h.Corr, func(b []byte) []byte {
		b = append(b, info...)
		return append(b, handshakeMAC(key, "info", nd, np, info)...)
	})); err != nil {
		return err
	}
	s.hello = true
	return nil
}

// clockSample is one estimate of a peer's clock offset: the producer's
// clock minus the midpoint of the AUTH → HELLO_ACK round trip, and that
// round trip.
type clockSample struct {
	offset, rtt time.Duration
	ok          bool
}

// clientHandshake runs the consumer's side of the handshake on a fresh
// connection and returns the producer's Info (its Clock moved into
// cn.clock as a sample).
func (c *Consumer) clientHandshake(ctx context.Context, cn *pconn) (Info, error) {
	stop := context.AfterFunc(ctx, cn.cancel)
	defer stop()
	timeout := c.cfg.DialTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	cn.setDeadline(timeout)
	key := c.cfg.Secret.channelKey()
	nd := nonce()
	corr := c.corr.Add(1)
	if _, err := cn.Write(frame(msgHello, corr, func(b []byte) []byte { return append(b, nd...) })); err != nil {
		return Info{}, cn.ioErr(ctx, "HELLO", err)
	}
	_, payload, err := cn.readResponse(ctx, corr, msgHello, msgChallenge)
	if err != nil {
		return Info{}, err
	}
	if len(payload) != nonceSize+macSize {
		cn.broken = true
		return Info{}, fmt.Errorf("%w: CHALLENGE carries %d bytes", ErrProtocol, len(payload))
	}
	np := payload[:nonceSize]
	if !hmac.Equal(payload[nonceSize:], handshakeMAC(key, "producer", nd, np, nil)) {
		cn.broken = true
		return Info{}, fmt.Errorf("%w: the peer did not prove it knows this engine's KV secret (not a prefill engine of this cluster, or started with another --kv-secret-file)", ErrUnauthenticated)
	}
	local := appendInfo(nil, &c.cfg.Local)
	sent := time.Now()
	if _, err := cn.Write(frame(msgAuth, corr, func(b []byte) []byte {
		b = append(b, handshakeMAC(key, "consumer", nd, np, nil)...)
		return append(b, local...)
	})); err != nil {
		return Info{}, cn.ioErr(ctx, "AUTH", err)
	}
	_, payload, err = cn.readResponse(ctx, corr, msgAuth, msgHelloAck)
	if err != nil {
		return Info{}, err
	}
	got := time.Now()
	if len(payload) < macSize {
		cn.broken = true
		return Info{}, fmt.Errorf("%w: HELLO_ACK carries %d bytes", ErrProtocol, len(payload))
	}
	body, mac := payload[:len(payload)-macSize], payload[len(payload)-macSize:]
	if !hmac.Equal(mac, handshakeMAC(key, "info", nd, np, body)) {
		cn.broken = true
		return Info{}, fmt.Errorf("%w: the prefill's handshake answer was altered in transit", ErrUnauthenticated)
	}
	info, err := decodeInfo(body)
	if err != nil {
		cn.broken = true
		return Info{}, fmt.Errorf("%w: HELLO_ACK: %w", ErrProtocol, err)
	}
	if !info.Clock.IsZero() {
		rtt := got.Sub(sent)
		cn.clock = clockSample{offset: info.Clock.Sub(sent.Add(rtt / 2)), rtt: rtt, ok: true}
	}
	info.Clock = time.Time{}
	return info, nil
}
