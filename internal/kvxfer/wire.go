package kvxfer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
	"unicode/utf8"
)

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

// maxString bounds one length-prefixed string (u16 length).
const maxString = math.MaxUint16

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

// Payload encoding: little-endian integers, strings as u16 length + bytes,
// lists as u32 count + elements.

func appendU16(b []byte, v uint16) []byte { return binary.LittleEndian.AppendUint16(b, v) }
func appendU32(b []byte, v uint32) []byte { return binary.LittleEndian.AppendUint32(b, v) }
func appendU64(b []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(b, v) }

func appendString(b []byte, s string) []byte {
	if len(s) > maxString {
		s = s[:maxString]
	}
	b = appendU16(b, uint16(len(s)))
	return append(b, s...)
}

// decoder reads a payload. The first failure sticks: callers check err once
// at the end. Every list length is checked against the bytes that remain
// before anything is allocated, so decoding never allocates more than a small
// multiple of the payload size.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: payload too short for %s", errBadFrame, what)
	}
}

func (d *decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b) < n {
		d.fail(what)
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u16(what string) uint16 {
	if v := d.take(2, what); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (d *decoder) u32(what string) uint32 {
	if v := d.take(4, what); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (d *decoder) u64(what string) uint64 {
	if v := d.take(8, what); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (d *decoder) str(what string) string {
	n := d.u16(what)
	v := d.take(int(n), what)
	if d.err == nil && !utf8.Valid(v) {
		d.err = fmt.Errorf("%w: %s is not valid UTF-8", errBadFrame, what)
	}
	return string(v)
}

// count reads a list length and checks that count elements of elemSize bytes
// each can still be in the payload.
func (d *decoder) count(elemSize int, what string) int {
	n := d.u32(what)
	if d.err == nil && uint64(n)*uint64(elemSize) > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: %s claims %d entries but only %d payload bytes remain", errBadFrame, what, n, len(d.b))
		return 0
	}
	return int(n)
}

// Info is what an engine tells its peer in the handshake (HELLO and
// HELLO_ACK): identity, model and KV geometry, and where its pool lives for
// same-host peers.
type Info struct {
	// EngineID identifies one engine process; a restarted engine has a new one.
	EngineID string
	// ModelFingerprint identifies the model and its weights (e.g. a hash of
	// config.json and the safetensors headers). Engines with different
	// fingerprints must not exchange KV.
	ModelFingerprint string
	// KVDType is the element type of the KV cache ("f32", "bf16").
	KVDType    string
	Layers     int
	KVHeads    int
	HeadDim    int
	BlockSize  int // tokens per block
	BlockBytes int // bytes per block (all layers, K and V)
	NumBlocks  int // blocks in the pool (producer); block ids are < NumBlocks
	// Host identifies the machine (kernel boot id and hostname) for
	// same-host detection.
	Host HostIdentity
	// Lease is the producer's lease duration (milliseconds on the wire);
	// consumers heartbeat every Lease/6. Zero in a consumer's HELLO.
	Lease time.Duration
	// Shm describes the producer's pool file; zero when it offers no shared
	// memory.
	Shm ShmLayout
	// Pid is the producer's process id (0 from a consumer): a same-host
	// decode maps the pool only through /proc/<Pid>/fd, so it can only
	// map a file the authenticated producer's process holds.
	Pid int
	// Generation changes whenever the producer's KV memory registration
	// does (a new process, even one reusing an engine id): params carrying
	// another generation name memory that is gone (vLLM's
	// remote_registration_generation).
	Generation uint64
	// Clock is the producer's wall clock when it sent HELLO_ACK (zero
	// from a consumer, and in the Info a consumer keeps): the consumer
	// estimates the clock offset from it, to judge deadlines stated in the
	// producer's clock.
	Clock time.Time
	// Kernels is the CPU kernel set the engine computes with (tensor.ISA;
	// "" from a peer that predates the field). Sets differ in rounding: KV
	// from a peer of another set is valid but not bit-identical to what
	// this engine would compute, so a consumer says so and goes on.
	Kernels string
}

// HostIdentity identifies a machine. Two engines are on the same host when
// both fields are equal and non-empty.
type HostIdentity struct {
	BootID   string // /proc/sys/kernel/random/boot_id
	Hostname string
}

// ShmLayout says where a KV pool lives in its shared-memory file, so a peer
// on the same host can map it read-only. Block i occupies
// [BlocksOffset + i*BlockBytes, +BlockBytes); its generation counter is the
// little-endian uint64 at GenerationsOffset + 8*i, updated atomically.
type ShmLayout struct {
	Path              string // e.g. /proc/<pid>/fd/<fd> of the pool's memory file
	Size              int64  // mapping size in bytes (the file's size)
	BlocksOffset      int64
	GenerationsOffset int64 // must be a multiple of 8
	// Dev and Inode identify the file (stat st_dev, st_ino) so a peer in
	// another mount namespace cannot mistake a different file at the same
	// path for this pool.
	Dev   uint64
	Inode uint64
}

func appendInfo(b []byte, in *Info) []byte {
	b = appendString(b, in.EngineID)
	b = appendString(b, in.ModelFingerprint)
	b = appendString(b, in.KVDType)
	b = appendU32(b, uint32(in.Layers))
	b = appendU32(b, uint32(in.KVHeads))
	b = appendU32(b, uint32(in.HeadDim))
	b = appendU32(b, uint32(in.BlockSize))
	b = appendU64(b, uint64(in.BlockBytes))
	b = appendU32(b, uint32(in.NumBlocks))
	b = appendString(b, in.Host.BootID)
	b = appendString(b, in.Host.Hostname)
	b = appendU64(b, uint64(in.Lease.Milliseconds()))
	b = appendString(b, in.Shm.Path)
	b = appendU64(b, uint64(in.Shm.Size))
	b = appendU64(b, uint64(in.Shm.BlocksOffset))
	b = appendU64(b, uint64(in.Shm.GenerationsOffset))
	b = appendU64(b, in.Shm.Dev)
	b = appendU64(b, in.Shm.Inode)
	b = appendU32(b, uint32(in.Pid))
	b = appendU64(b, in.Generation)
	var clk uint64
	if !in.Clock.IsZero() {
		clk = uint64(in.Clock.UnixNano())
	}
	b = appendU64(b, clk)
	b = appendString(b, in.Kernels)
	return b
}

// decodeInfo decodes a HELLO or HELLO_ACK payload. Trailing bytes are
// ignored: they are fields a later minor revision appended.
func decodeInfo(p []byte) (Info, error) {
	d := decoder{b: p}
	var in Info
	in.EngineID = d.str("engine id")
	in.ModelFingerprint = d.str("model fingerprint")
	in.KVDType = d.str("kv dtype")
	in.Layers = int(d.u32("layers"))
	in.KVHeads = int(d.u32("kv heads"))
	in.HeadDim = int(d.u32("head dim"))
	in.BlockSize = int(d.u32("block size"))
	bb := d.u64("block bytes")
	in.NumBlocks = int(d.u32("num blocks"))
	in.Host.BootID = d.str("boot id")
	in.Host.Hostname = d.str("hostname")
	lease := d.u64("lease")
	in.Shm.Path = d.str("shm path")
	size := d.u64("shm size")
	bo := d.u64("shm blocks offset")
	gof := d.u64("shm generations offset")
	in.Shm.Dev = d.u64("shm dev")
	in.Shm.Inode = d.u64("shm inode")
	in.Pid = int(d.u32("pid"))
	in.Generation = d.u64("generation")
	if clk := d.u64("clock"); clk != 0 && clk <= math.MaxInt64 {
		in.Clock = time.Unix(0, int64(clk))
	}
	if d.err == nil && len(d.b) > 0 { // appended in a later revision
		in.Kernels = d.str("kernels")
	}
	if d.err != nil {
		return Info{}, d.err
	}
	const maxI64 = math.MaxInt64
	if bb == 0 || bb > math.MaxUint32 || lease > maxI64/uint64(time.Millisecond) || size > maxI64 || bo > maxI64 || gof > maxI64 {
		return Info{}, fmt.Errorf("%w: handshake field out of range (block bytes %d, lease %d, shm size %d, offsets %d/%d)", errBadFrame, bb, lease, size, bo, gof)
	}
	in.BlockBytes = int(bb)
	in.Lease = time.Duration(lease) * time.Millisecond
	in.Shm.Size, in.Shm.BlocksOffset, in.Shm.GenerationsOffset = int64(size), int64(bo), int64(gof)
	return in, nil
}

// blockRequest is the payload of READ and SHM_READ.
type blockRequest struct {
	RequestID string
	Blocks    []int
}

func appendBlockRequest(b []byte, r *blockRequest) []byte {
	b = appendString(b, r.RequestID)
	b = appendU32(b, uint32(len(r.Blocks)))
	for _, id := range r.Blocks {
		b = appendU32(b, uint32(id))
	}
	return b
}

func decodeBlockRequest(p []byte) (blockRequest, error) {
	d := decoder{b: p}
	var r blockRequest
	r.RequestID = d.str("request id")
	n := d.count(4, "block ids")
	if d.err == nil {
		r.Blocks = make([]int, n)
		for i := range r.Blocks {
			r.Blocks[i] = int(d.u32("block id"))
		}
	}
	return r, d.err
}

func appendGens(b []byte, gens []uint64) []byte {
	b = appendU32(b, uint32(len(gens)))
	for _, g := range gens {
		b = appendU64(b, g)
	}
	return b
}

func decodeGens(p []byte) ([]uint64, error) {
	d := decoder{b: p}
	n := d.count(8, "generations")
	if d.err != nil {
		return nil, d.err
	}
	g := make([]uint64, n)
	for i := range g {
		g[i] = d.u64("generation")
	}
	return g, d.err
}

// appendIDs encodes a list of request ids (HEARTBEAT, ACK).
func appendIDs(b []byte, ids []string) []byte {
	b = appendU32(b, uint32(len(ids)))
	for _, id := range ids {
		b = appendString(b, id)
	}
	return b
}

func decodeIDs(p []byte) ([]string, error) {
	d := decoder{b: p}
	n := d.count(2, "request ids") // each id takes at least its u16 length
	if d.err != nil {
		return nil, d.err
	}
	ids := make([]string, 0, n)
	for range n {
		ids = append(ids, d.str("request id"))
	}
	return ids, d.err
}

func decodeDone(p []byte) (string, error) {
	d := decoder{b: p}
	id := d.str("request id")
	return id, d.err
}

// ErrorCode classifies an ERROR frame.
type ErrorCode uint16

// Error codes. Values are part of the wire format: never renumber.
const (
	CodeBadFrame          ErrorCode = 1 // the peer violated the protocol; connection closed
	CodeVersion           ErrorCode = 2 // unsupported protocol version
	CodeNotHeld           ErrorCode = 3 // request unknown, released or expired
	CodeBadBlock          ErrorCode = 4 // block id not part of the held request
	CodeGenerationChanged ErrorCode = 5 // a block was reused while being read
	CodeBusy              ErrorCode = 6 // connection limit reached
	CodeShuttingDown      ErrorCode = 7 // producer is closing
	CodeNoShm             ErrorCode = 8 // producer does not offer shared memory
	CodeInternal          ErrorCode = 9
	CodeUnauthenticated   ErrorCode = 10 // the handshake's proof did not match the secret
)

func (c ErrorCode) String() string {
	switch c {
	case CodeBadFrame:
		return "bad_frame"
	case CodeVersion:
		return "version"
	case CodeNotHeld:
		return "not_held"
	case CodeBadBlock:
		return "bad_block"
	case CodeGenerationChanged:
		return "generation_changed"
	case CodeBusy:
		return "busy"
	case CodeShuttingDown:
		return "shutting_down"
	case CodeNoShm:
		return "no_shm"
	case CodeInternal:
		return "internal"
	case CodeUnauthenticated:
		return "unauthenticated"
	}
	return fmt.Sprintf("code_%d", uint16(c))
}

// RemoteError is an ERROR frame received from the peer.
type RemoteError struct {
	Code    ErrorCode
	Message string
}

func (e *RemoteError) Error() string { return e.Message }

func appendError(b []byte, code ErrorCode, msg string) []byte {
	b = appendU16(b, uint16(code))
	return appendString(b, msg)
}

func decodeError(p []byte) *RemoteError {
	d := decoder{b: p}
	code := ErrorCode(d.u16("error code"))
	msg := d.str("error message")
	if d.err != nil {
		return &RemoteError{Code: CodeBadFrame, Message: fmt.Sprintf("peer sent an undecodable ERROR frame: %v", d.err)}
	}
	return &RemoteError{Code: code, Message: msg}
}
