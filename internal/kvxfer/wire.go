package kvxfer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The frame: a 20-byte header (magic "TKVX", version, type, reserved flags,
// correlation id, payload length) and a payload; parseHeader validates a
// header before any payload is read, readControl reads a control frame and
// frame builds one. The payloads are in codec.go (primitives), messages.go
// and errcodes.go; docs/kv-transfer.md has the protocol.

// ProtocolVersion is the side-channel wire protocol version this package
// speaks. It is the major version: peers must speak the same one. Fields
// appended to the end of a payload do not change it (readers ignore trailing
// bytes); anything else does. See docs/kv-transfer.md, "Versioning".
const ProtocolVersion = 2

// magic opens every frame: "TKVX".
var magic = [4]byte{'T', 'K', 'V', 'X'}

// headerSize is the fixed size of a frame header in bytes.
const headerSize = 20

// MaxControlPayload bounds the payload of every frame except DATA. A peer
// announcing a longer control payload is violating the protocol; the frame is
// rejected before any payload memory is allocated.
const MaxControlPayload = 1 << 20

// msgType is the type byte of a frame.
type msgType uint8

// Message types. Values are part of the wire format: never renumber.
const (
	msgHello     msgType = 1  // consumer → producer: who I am
	msgHelloAck  msgType = 2  // producer → consumer: who I am, pool geometry
	msgRead      msgType = 3  // consumer → producer: send these blocks of request R
	msgData      msgType = 4  // producer → consumer: one block's bytes
	msgReadDone  msgType = 5  // producer → consumer: all blocks sent, generations stable
	msgShmRead   msgType = 6  // consumer → producer: validate lease, tell me generations
	msgShmGens   msgType = 7  // producer → consumer: generations of the requested blocks
	msgDone      msgType = 8  // consumer → producer: finished with request R, free it
	msgHeartbeat msgType = 9  // consumer → producer: extend these leases
	msgAck       msgType = 10 // producer → consumer: DONE / HEARTBEAT handled
	msgError     msgType = 11 // either way: code + message
	msgChallenge msgType = 12 // producer → consumer: nonce + proof of the secret
	msgAuth      msgType = 13 // consumer → producer: proof of the secret + who I am
)

func (t msgType) String() string {
	switch t {
	case msgHello:
		return "HELLO"
	case msgHelloAck:
		return "HELLO_ACK"
	case msgRead:
		return "READ"
	case msgData:
		return "DATA"
	case msgReadDone:
		return "READ_DONE"
	case msgShmRead:
		return "SHM_READ"
	case msgShmGens:
		return "SHM_GENS"
	case msgDone:
		return "DONE"
	case msgHeartbeat:
		return "HEARTBEAT"
	case msgAck:
		return "ACK"
	case msgError:
		return "ERROR"
	case msgChallenge:
		return "CHALLENGE"
	case msgAuth:
		return "AUTH"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

func (t msgType) known() bool { return t >= msgHello && t <= msgAuth }

// header is a decoded frame header.
type header struct {
	Version uint8
	Type    msgType
	Corr    uint64 // correlation id: a response carries its request's id
	Len     uint32 // payload length in bytes
}

// errBadFrame marks a protocol violation by the peer. The connection cannot
// be trusted to be in sync afterwards and is closed.
var errBadFrame = errors.New("malformed frame")

func putHeader(b []byte, t msgType, corr uint64, n int) {
	copy(b[0:4], magic[:])
	b[4] = ProtocolVersion
	b[5] = byte(t)
	b[6], b[7] = 0, 0 // flags: reserved, must be zero
	binary.LittleEndian.PutUint64(b[8:16], corr)
	binary.LittleEndian.PutUint32(b[16:20], uint32(n))
}

// parseHeader validates a frame header. A header with a foreign version is
// returned together with errVersion so the caller can answer with an ERROR
// that the peer, whatever its version, can read (the first 20 bytes of the
// header are frozen across versions).
func parseHeader(b []byte) (header, error) {
	if len(b) < headerSize {
		return header{}, fmt.Errorf("%w: header is %d bytes, want %d", errBadFrame, len(b), headerSize)
	}
	if [4]byte(b[0:4]) != magic {
		return header{}, fmt.Errorf("%w: bad magic %q (is something other than a tandem kv side channel listening on this port?)", errBadFrame, b[0:4])
	}
	h := header{
		Version: b[4],
		Type:    msgType(b[5]),
		Corr:    binary.LittleEndian.Uint64(b[8:16]),
		Len:     binary.LittleEndian.Uint32(b[16:20]),
	}
	if h.Version != ProtocolVersion {
		return h, &versionError{theirs: h.Version}
	}
	if b[6] != 0 || b[7] != 0 {
		return h, fmt.Errorf("%w: reserved flags %#x set", errBadFrame, binary.LittleEndian.Uint16(b[6:8]))
	}
	if !h.Type.known() {
		return h, fmt.Errorf("%w: unknown message type %d", errBadFrame, uint8(h.Type))
	}
	if h.Type != msgData && h.Len > MaxControlPayload {
		return h, fmt.Errorf("%w: %s payload of %d bytes exceeds the %d-byte limit", errBadFrame, h.Type, h.Len, MaxControlPayload)
	}
	return h, nil
}

// versionError reports a peer speaking another protocol version.
type versionError struct{ theirs uint8 }

func (e *versionError) Error() string {
	return fmt.Sprintf("peer speaks kv side-channel protocol version %d, this engine speaks %d: run the same tandem release on prefill and decode engines", e.theirs, ProtocolVersion)
}

// readHeader reads and validates one frame header from a producer. The
// magic is checked as its first bytes arrive, so a peer speaking another
// protocol that waits for ours (ZeroMQ sends its 10-byte signature and
// waits) is named at once rather than after the read's deadline.
func readHeader(r io.Reader, buf *[headerSize]byte) (header, error) {
	return readHeaderChecked(r, buf, foreignPeer)
}

// readHeaderChecked reads a frame header, calling foreign with the bytes
// read so far as soon as they cannot start a frame.
func readHeaderChecked(r io.Reader, buf *[headerSize]byte, foreign func([]byte) error) (header, error) {
	n := 0
	for n < headerSize {
		m, err := r.Read(buf[n:])
		n += m
		if k := min(n, len(magic)); !bytes.Equal(buf[:k], magic[:k]) {
			return header{}, foreign(buf[:n])
		}
		if n == headerSize {
			break
		}
		if err != nil {
			if err == io.EOF && n > 0 {
				err = io.ErrUnexpectedEOF
			}
			return header{}, err
		}
	}
	return parseHeader(buf[:])
}

// foreignPeer is the error for a peer whose first bytes b are not a
// frame's: it names the protocol where the bytes tell (ZeroMQ's signature
// is what vLLM's NIXL side channel answers with).
func foreignPeer(b []byte) error {
	if len(b) > 0 && b[0] == 0xFF {
		return fmt.Errorf("%w: the peer speaks ZeroMQ (ZMTP), not Tandem's KV side channel — vLLM's NIXL connector listens like this: a Tandem engine exchanges KV only with Tandem engines, so kv_transfer_params from a vLLM prefill must go to a vLLM decode", errBadFrame)
	}
	return fmt.Errorf("%w: bad magic %q (is something other than a tandem kv side channel listening on this port?)", errBadFrame, b[:min(len(b), len(magic))])
}

// readControl reads one control frame (any type but DATA) with its payload.
// The payload buffer is allocated only after the header passed validation,
// so a hostile length field costs at most MaxControlPayload bytes.
func readControl(r io.Reader) (header, []byte, error) {
	var hb [headerSize]byte
	h, err := readHeader(r, &hb)
	if err != nil {
		return h, nil, err
	}
	if h.Type == msgData {
		return h, nil, fmt.Errorf("%w: unexpected DATA frame", errBadFrame)
	}
	p := make([]byte, h.Len)
	if _, err := io.ReadFull(r, p); err != nil {
		return h, nil, err
	}
	return h, p, nil
}

// frame builds a control frame: header followed by the payload the encoder
// appends.
func frame(t msgType, corr uint64, enc func(b []byte) []byte) []byte {
	b := make([]byte, headerSize, 256)
	if enc != nil {
		b = enc(b)
	}
	putHeader(b, t, corr, len(b)-headerSize)
	return b
}
