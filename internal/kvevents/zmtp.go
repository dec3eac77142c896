package kvevents

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// The subset of ZMTP 3.x (https://rfc.zeromq.org/spec/23/ and /37/) that KV
// events need: the NULL security mechanism and the framing of PUB/SUB and
// ROUTER/DEALER(REQ), over TCP. It speaks to libzmq peers (pyzmq in vLLM,
// llm-d's and Dynamo's indexers) as a PUB or ROUTER, and to libzmq or Tandem
// publishers as a SUB or DEALER.
//
// Why not github.com/go-zeromq/zmq4 (v0.17): its PUB writes each message to
// every subscriber in turn from one goroutine, so one stalled subscriber
// stalls all of them, and its high-water mark drops for the whole socket;
// its SUB does not tell the caller that the publisher went away (automatic
// reconnection re-dials from the connection reaper and writes the endpoint
// unguarded). Here each subscriber has its own bounded queue (libzmq's
// per-peer HWM) and a subscriber sees the connection end, which is what
// restart detection needs. The whole protocol subset is below.

// Socket types as they appear in the READY command's Socket-Type property.
const (
	typePUB    = "PUB"
	typeSUB    = "SUB"
	typeROUTER = "ROUTER"
	typeDEALER = "DEALER"
)

// compatible lists the peer socket types each of ours may talk to (ZMTP
// 23/ZMTP §"Socket types").
var compatible = map[string][]string{
	typePUB:    {"SUB", "XSUB"},
	typeSUB:    {"PUB", "XPUB"},
	typeROUTER: {"DEALER", "REQ", "ROUTER"},
	typeDEALER: {"ROUTER", "REP", "DEALER"},
}

// Frame flags.
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// maxCommandSize bounds a command frame (READY with metadata, SUBSCRIBE).
const maxCommandSize = 64 << 10

// zconn is one ZMTP connection after the handshake. Reads and writes may
// run on two goroutines; each side is used by one goroutine at a time.
type zconn struct {
	c        net.Conn
	r        *bufio.Reader
	w        *bufio.Writer
	minor    byte   // the peer's ZMTP minor version (0: 3.0, 1: 3.1)
	peerType string // the peer's Socket-Type
	maxFrame int64  // largest frame read
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

// handshake runs the greeting and the NULL mechanism's READY exchange on c,
// within timeout, as a socket of type sockType. maxFrame bounds the message
// frames read afterwards.
func handshake(c net.Conn, sockType string, asServer bool, timeout time.Duration, maxFrame int64) (*zconn, error) {
	if timeout > 0 {
		c.SetDeadline(time.Now().Add(timeout))
		defer c.SetDeadline(time.Time{})
	}
	z := &zconn{c: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10), maxFrame: maxFrame}
	if _, err := c.Write(greeting(asServer)); err != nil {
		return nil, fmt.Errorf("zmtp greeting: %w", err)
	}
	var peer [64]byte
	if _, err := io.ReadFull(z.r, peer[:]); err != nil {
		return nil, fmt.Errorf("zmtp greeting: %w", err)
	}
	if peer[0] != 0xff || peer[9]&1 != 1 {
		return nil, errors.New("zmtp greeting: not a ZMTP peer")
	}
	if peer[10] < 3 {
		return nil, fmt.Errorf("zmtp greeting: peer speaks ZMTP %d.%d, want 3.x", peer[10], peer[11])
	}
	z.minor = min(peer[11], 1)
	if peer[10] > 3 {
		z.minor = 1
	}
	if mech := string(bytes.TrimRight(peer[12:32], "\x00")); mech != "NULL" {
		return nil, fmt.Errorf("zmtp greeting: peer wants security mechanism %q; only NULL is supported", mech)
	}

	ready := []byte("\x05READY")
	ready = appendProp(ready, "Socket-Type", sockType)
	if sockType == typeDEALER || sockType == typeROUTER {
		ready = appendProp(ready, "Identity", "")
	}
	if err := z.writeFrame(ready, flagCommand); err != nil {
		return nil, fmt.Errorf("zmtp ready: %w", err)
	}
	if err := z.w.Flush(); err != nil {
		return nil, fmt.Errorf("zmtp ready: %w", err)
	}
	body, flags, err := z.readFrame()
	if err != nil {
		return nil, fmt.Errorf("zmtp ready: %w", err)
	}
	name, data, ok := parseCommand(body)
	if flags&flagCommand == 0 || !ok {
		return nil, errors.New("zmtp ready: peer sent no command")
	}
	if name == "ERROR" {
		reason := ""
		if len(data) > 0 && int(data[0]) <= len(data)-1 {
			reason = string(data[1 : 1+data[0]])
		}
		return nil, fmt.Errorf("zmtp ready: peer refused: %q", reason)
	}
	if name != "READY" {
		return nil, fmt.Errorf("zmtp ready: peer sent %q", name)
	}
	props, err := parseProps(data)
	if err != nil {
		return nil, fmt.Errorf("zmtp ready: %w", err)
	}
	z.peerType = strings.ToUpper(props["socket-type"])
	okType := false
	for _, t := range compatible[sockType] {
		okType = okType || t == z.peerType
	}
	if !okType {
		return nil, fmt.Errorf("zmtp ready: a %s socket cannot talk to a %q socket", sockType, z.peerType)
	}
	return z, nil
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

// parseProps parses ZMTP metadata; names are case-insensitive.
func parseProps(p []byte) (map[string]string, error) {
	props := make(map[string]string)
	for len(p) > 0 {
		n := int(p[0])
		if n == 0 || len(p) < 1+n+4 {
			return nil, errors.New("malformed metadata")
		}
		name := strings.ToLower(string(p[1 : 1+n]))
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

// readFrame reads one frame. Command frames are bounded by maxCommandSize,
// message frames by maxFrame.
func (z *zconn) readFrame() (body []byte, flags byte, err error) {
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
		limit = maxCommandSize
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

// writeFrame buffers one frame; the caller flushes.
func (z *zconn) writeFrame(body []byte, flags byte) error {
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

// writeMsg buffers a multipart message; the caller flushes.
func (z *zconn) writeMsg(frames ...[]byte) error {
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

// maxParts bounds the frames of one message read.
const maxParts = 16

// readMsg reads the next multipart message. Commands between messages go to
// onCommand (nil: ignored); a PING is answered with a PONG before that
// (ZMTP 3.1 heartbeats), which writes, so readMsg must not run while
// another goroutine writes unless onCommand handles PING itself.
func (z *zconn) readMsg(onCommand func(name string, data []byte) error) ([][]byte, error) {
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
			if onCommand != nil {
				if err := onCommand(name, data); err != nil {
					return nil, err
				}
			}
			continue
		}
		if len(parts) == maxParts {
			return nil, fmt.Errorf("zmtp: message of more than %d frames", maxParts)
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
