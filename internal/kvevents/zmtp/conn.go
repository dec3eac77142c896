package zmtp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// Socket types as they appear in the READY command's Socket-Type property.
const (
	PUB    = "PUB"
	SUB    = "SUB"
	ROUTER = "ROUTER"
	DEALER = "DEALER"
)

// compatible lists the peer socket types each of ours may talk to (ZMTP
// 23/ZMTP §"Socket types").
var compatible = map[string][]string{
	PUB:    {"SUB", "XSUB"},
	SUB:    {"PUB", "XPUB"},
	ROUTER: {"DEALER", "REQ", "ROUTER"},
	DEALER: {"ROUTER", "REP", "DEALER"},
}

// Frame flags.
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// MaxCommandSize bounds a command frame (READY with metadata, SUBSCRIBE).
const MaxCommandSize = 64 << 10

// MaxParts bounds the frames of one message read.
const MaxParts = 16

// Conn is one ZMTP connection after the handshake. One goroutine may read
// (ReadMsg) while others write (Write, Flush, Subscribe): writes are
// serialized, and ReadMsg answers a PING with a PONG between two whole
// messages.
type Conn struct {
	nc       net.Conn // nil only in tests that read from bytes
	r        *bufio.Reader
	minor    byte   // the peer's ZMTP minor version (0: 3.0, 1: 3.1)
	peerType string // the peer's Socket-Type
	maxFrame int64  // largest message frame read

	wmu          sync.Mutex
	w            *bufio.Writer
	writeTimeout time.Duration

	stop func() bool // ends Dial's context watch; nil otherwise
}

// newConn wraps r and w; nc, if not nil, gets the write deadlines.
func newConn(nc net.Conn, r io.Reader, w io.Writer, maxFrame int64, writeTimeout time.Duration) *Conn {
	return &Conn{nc: nc, r: bufio.NewReaderSize(r, 64<<10), w: bufio.NewWriterSize(w, 64<<10), maxFrame: maxFrame, writeTimeout: writeTimeout}
}

// Handshake runs the greeting and the NULL mechanism's READY exchange on nc
// as a socket of type sockType (PUB, SUB, ROUTER or DEALER), within
// opts.HandshakeTimeout, and checks that the peer's type may talk to it.
// opts.MaxFrame bounds the message frames read afterwards. On error the
// caller closes nc.
func Handshake(nc net.Conn, sockType string, asServer bool, opts Options) (*Conn, error) {
	opts = opts.withDefaults()
	if _, ok := compatible[sockType]; !ok {
		return nil, fmt.Errorf("zmtp: unknown socket type %q", sockType)
	}
	nc.SetDeadline(time.Now().Add(opts.HandshakeTimeout))
	defer nc.SetDeadline(time.Time{})
	z := newConn(nc, nc, nc, opts.MaxFrame, opts.WriteTimeout)
	if err := z.handshake(sockType, asServer); err != nil {
		return nil, err
	}
	return z, nil
}

// greeting returns the 64-byte ZMTP 3.1 greeting for the NULL mechanism.
func greeting(asServer bool) []byte {
	g := make([]byte, 64)
	g[0], g[9] = 0xff, 0x7f // signature
	g[10], g[11] = 3, 1     // version 3.1
	copy(g[12:32], "NULL")  // mechanism, zero padded
	if asServer {
		g[32] = 1
	}
	return g
}

func (z *Conn) handshake(sockType string, asServer bool) error {
	if _, err := z.w.Write(greeting(asServer)); err != nil {
		return fmt.Errorf("zmtp greeting: %w", err)
	}
	if err := z.w.Flush(); err != nil {
		return fmt.Errorf("zmtp greeting: %w", err)
	}
	var peer [64]byte
	if _, err := io.ReadFull(z.r, peer[:]); err != nil {
		return fmt.Errorf("zmtp greeting: %w", err)
	}
	if peer[0] != 0xff || peer[9]&1 != 1 {
		return errors.New("zmtp greeting: not a ZMTP peer")
	}
	if peer[10] < 3 {
		return fmt.Errorf("zmtp greeting: peer speaks ZMTP %d.%d, want 3.x", peer[10], peer[11])
	}
	z.minor = min(peer[11], 1)
	if peer[10] > 3 {
		z.minor = 1
	}
	if mech := string(bytes.TrimRight(peer[12:32], "\x00")); mech != "NULL" {
		return fmt.Errorf("zmtp greeting: peer wants security mechanism %q; only NULL is supported", mech)
	}

	ready := []byte("\x05READY")
	ready = appendProp(ready, "Socket-Type", sockType)
	if sockType == DEALER || sockType == ROUTER {
		ready = appendProp(ready, "Identity", "")
	}
	if err := z.writeFrame(ready, flagCommand); err != nil {
		return fmt.Errorf("zmtp ready: %w", err)
	}
	if err := z.w.Flush(); err != nil {
		return fmt.Errorf("zmtp ready: %w", err)
	}
	body, flags, err := z.readFrame()
	if err != nil {
		return fmt.Errorf("zmtp ready: %w", err)
	}
	name, data, ok := parseCommand(body)
	if flags&flagCommand == 0 || !ok {
		return errors.New("zmtp ready: peer sent no command")
	}
	if name == "ERROR" {
		reason := ""
		if len(data) > 0 && int(data[0]) <= len(data)-1 {
			reason = string(data[1 : 1+data[0]])
		}
		return fmt.Errorf("zmtp ready: peer refused: %q", reason)
	}
	if name != "READY" {
		return fmt.Errorf("zmtp ready: peer sent %q", name)
	}
	props, err := parseProps(data)
	if err != nil {
		return fmt.Errorf("zmtp ready: %w", err)
	}
	z.peerType = strings.ToUpper(props["socket-type"])
	okType := false
	for _, t := range compatible[sockType] {
		okType = okType || t == z.peerType
	}
	if !okType {
		return fmt.Errorf("zmtp ready: a %s socket cannot talk to a %q socket", sockType, z.peerType)
	}
	return nil
}

// PeerType is the peer's Socket-Type (upper case).
func (z *Conn) PeerType() string { return z.peerType }

// RemoteAddr is the peer's address.
func (z *Conn) RemoteAddr() net.Addr { return z.nc.RemoteAddr() }

// Close closes the connection.
func (z *Conn) Close() error {
	if z.stop != nil {
		z.stop()
	}
	return z.nc.Close()
}

func appendProp(dst []byte, name, value string) []byte {
	dst = append(dst, byte(len(name)))
	dst = append(dst, name...)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(value)))
	return append(dst, value...)
}

// parseCommand splits a command frame into its name and data.
func parseCommand(body []byte) (name string, data []byte, ok bool) {
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return "", nil, false
	}
	return string(body[1 : 1+body[0]]), body[1+body[0]:], true
}

// parseProps parses ZMTP metadata. Names are case-insensitive and ASCII
// (ZMTP 23 §"The metadata"): they come back lowered, byte for byte.
func parseProps(p []byte) (map[string]string, error) {
	props := make(map[string]string)
	for len(p) > 0 {
		n := int(p[0])
		if n == 0 || len(p) < 1+n+4 {
			return nil, errors.New("malformed metadata")
		}
		lower := []byte(string(p[1 : 1+n]))
		for i, c := range lower {
			if 'A' <= c && c <= 'Z' {
				lower[i] = c + 'a' - 'A'
			}
		}
		name := string(lower)
		p = p[1+n:]
		vl := binary.BigEndian.Uint32(p)
		p = p[4:]
		if uint64(vl) > uint64(len(p)) {
			return nil, errors.New("malformed metadata")
		}
		props[name] = string(p[:vl])
		p = p[vl:]
	}
	return props, nil
}

// readFrame reads one frame. Command frames are bounded by MaxCommandSize,
// message frames by maxFrame.
func (z *Conn) readFrame() (body []byte, flags byte, err error) {
	flags, err = z.r.ReadByte()
	if err != nil {
		return nil, 0, err
	}
	if flags&^(flagMore|flagLong|flagCommand) != 0 {
		return nil, 0, fmt.Errorf("zmtp: bad frame flags 0x%02x", flags)
	}
	var size uint64
	if flags&flagLong != 0 {
		var b [8]byte
		if _, err := io.ReadFull(z.r, b[:]); err != nil {
			return nil, 0, err
		}
		size = binary.BigEndian.Uint64(b[:])
	} else {
		c, err := z.r.ReadByte()
		if err != nil {
			return nil, 0, err
		}
		size = uint64(c)
	}
	limit := uint64(z.maxFrame)
	if flags&flagCommand != 0 {
		limit = MaxCommandSize
	}
	if size > limit {
		return nil, 0, fmt.Errorf("zmtp: %d-byte frame exceeds the limit of %d", size, limit)
	}
	body = make([]byte, size)
	if _, err := io.ReadFull(z.r, body); err != nil {
		return nil, 0, err
	}
	return body, flags, nil
}

// writeFrame buffers one frame; the caller holds wmu (or is the handshake)
// and flushes.
func (z *Conn) writeFrame(body []byte, flags byte) error {
	var hdr [9]byte
	hdr[0] = flags
	n := 2
	if len(body) > 255 {
		hdr[0] |= flagLong
		binary.BigEndian.PutUint64(hdr[1:], uint64(len(body)))
		n = 9
	} else {
		hdr[1] = byte(len(body))
	}
	if _, err := z.w.Write(hdr[:n]); err != nil {
		return err
	}
	_, err := z.w.Write(body)
	return err
}

// deadline sets the write deadline; the caller holds wmu.
func (z *Conn) deadline() {
	if z.nc != nil && z.writeTimeout > 0 {
		z.nc.SetWriteDeadline(time.Now().Add(z.writeTimeout))
	}
}

// Write buffers a multipart message; Flush sends what is buffered.
func (z *Conn) Write(frames ...[]byte) error {
	z.wmu.Lock()
	defer z.wmu.Unlock()
	z.deadline()
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		if err := z.writeFrame(f, flags); err != nil {
			return err
		}
	}
	return nil
}

// Flush sends the buffered messages.
func (z *Conn) Flush() error {
	z.wmu.Lock()
	defer z.wmu.Unlock()
	z.deadline()
	return z.w.Flush()
}

// command writes and flushes a command frame.
func (z *Conn) command(body []byte) error {
	z.wmu.Lock()
	defer z.wmu.Unlock()
	z.deadline()
	if err := z.writeFrame(body, flagCommand); err != nil {
		return err
	}
	return z.w.Flush()
}

// Subscribe subscribes a SUB connection to messages whose first frame
// starts with topic (empty: all): a SUBSCRIBE command to a ZMTP 3.1 peer, a
// message [1, topic] to a 3.0 one.
func (z *Conn) Subscribe(topic []byte) error {
	if z.minor >= 1 {
		return z.command(append([]byte("\x09SUBSCRIBE"), topic...))
	}
	if err := z.Write(append([]byte{1}, topic...)); err != nil {
		return err
	}
	return z.Flush()
}

// ReadMsg reads the next multipart message. A PING between messages is
// answered with a PONG (ZMTP 3.1 heartbeats); other commands go to
// onCommand (nil: ignored), whose error ends the read.
func (z *Conn) ReadMsg(onCommand func(name string, data []byte) error) ([][]byte, error) {
	var parts [][]byte
	for {
		body, flags, err := z.readFrame()
		if err != nil {
			return nil, err
		}
		if flags&flagCommand != 0 {
			if len(parts) > 0 {
				return nil, errors.New("zmtp: command inside a multipart message")
			}
			name, data, ok := parseCommand(body)
			if !ok {
				return nil, errors.New("zmtp: malformed command")
			}
			if name == "PING" {
				err = z.command(pong(data))
			} else if onCommand != nil {
				err = onCommand(name, data)
			}
			if err != nil {
				return nil, err
			}
			continue
		}
		if len(parts) == MaxParts {
			return nil, fmt.Errorf("zmtp: message of more than %d frames", MaxParts)
		}
		parts = append(parts, body)
		if flags&flagMore == 0 {
			return parts, nil
		}
	}
}

// pong answers a PING's context (ZMTP 37 §"PING and PONG").
func pong(data []byte) []byte {
	ctx := data
	if len(ctx) >= 2 {
		ctx = ctx[2:] // after the TTL
	} else {
		ctx = nil
	}
	if len(ctx) > 16 {
		ctx = ctx[:16]
	}
	return append([]byte("\x04PONG"), ctx...)
}
