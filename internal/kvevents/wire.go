package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/tandem-serve/tandem/internal/kvcache"
)

// Kind is the tag of an event in vLLM's tagged union.
type Kind uint8

// The event kinds, named after vLLM's structs (their msgspec tags).
const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

var kindTags = [...]string{BlockStored: "BlockStored", BlockRemoved: "BlockRemoved", AllBlocksCleared: "AllBlocksCleared"}

func (k Kind) String() string {
	if int(k) < len(kindTags) && kindTags[k] != "" {
		return kindTags[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MediumGPU is vLLM's name for the engine's primary KV cache (MEDIUM_GPU;
// offload tiers are named "CPU" and so on). A Tandem engine's paged pool is
// its primary cache, in host memory, so it is published as "GPU": indexers
// weigh that tier highest, which is what a hit in it is worth.
const MediumGPU = "GPU"

// Event is one KV cache event: vLLM's BlockStored, BlockRemoved or
// AllBlocksCleared. Block hashes are the 64-bit integers vLLM publishes by
// default (see WireHash).
type Event struct {
	Kind Kind
	// Hashes are the blocks stored or removed, in chain order for a store.
	Hashes []uint64
	// Parent is the hash of the block before Hashes[0] (BlockStored), valid
	// when HasParent; a store starting a sequence has none.
	Parent    uint64
	HasParent bool
	// Tokens are the token ids of the stored blocks, BlockSize per block.
	Tokens    []int32
	BlockSize int
	// Medium is the cache tier ("" encodes as None).
	Medium string
}

// Batch is vLLM's KVEventBatch: the events of one engine step.
type Batch struct {
	// TS is the wall-clock time of the batch in seconds since the epoch.
	TS     float64
	Events []Event
	// DataParallelRank is the engine's rank; HasRank false encodes None.
	DataParallelRank int
	HasRank          bool
}

// WireHash is a Tandem block hash as it goes on the wire: its last 8 bytes
// read big-endian, which is what vLLM publishes for its own 32-byte block
// hashes by default (maybe_convert_block_hash in
// vllm/v1/core/kv_cache_utils.py, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1)
// and what llm-d's and Dynamo's indexers key on.
func WireHash(h kvcache.BlockHash) uint64 {
	return binary.BigEndian.Uint64(h[len(h)-8:])
}

// BlockHashes returns the wire hashes (WireHash) of the full blocks of
// tokens as an engine serving the model with this fingerprint
// (engine.Forwarder.Fingerprint, the prefix cache's extra key) and block size
// computes them: what a router looks up in an Index. A partial last block
// has no hash, as in the engine.
func BlockHashes(fingerprint string, blockSize int, tokens []int32) []uint64 {
	full := kvcache.BlockHashes(fingerprint, blockSize, nil, tokens)
	out := make([]uint64, len(full))
	for i, h := range full {
		out[i] = WireHash(h)
	}
	return out
}

// The wire layout, matched field for field to vLLM's msgspec structs in
// vllm/distributed/kv_events.py (EventBatch, KVCacheEvent and its
// subclasses). msgspec encodes an array_like struct as a msgpack array of its
// fields in declaration order, a tagged one (tag=True) with the tag, the
// class name, as the first element, and with omit_defaults it leaves out the
// trailing fields still at their defaults; fields without a default (lora_id,
// medium, lora_name) are always present, as nil when None. So:
//
//	KVEventBatch     [ts float64, [event...], data_parallel_rank]
//	BlockStored      ["BlockStored", [hash...], parent|nil, [token...], block_size, lora_id=nil, medium, lora_name=nil]
//	BlockRemoved     ["BlockRemoved", [hash...], medium]
//	AllBlocksCleared ["AllBlocksCleared"]
//
// extra_keys, group_idx and kv_cache_spec_* default to None and are left
// out (one KV cache group, no LoRA, no multimodal keys). msgspec writes
// floats as float64 and integers, strings and arrays in their smallest
// msgpack form; the encoder below does the same, so its bytes equal
// msgspec's. vLLM PR #42892 (2026) dropped array_like from the event structs
// (events become maps with a "type" key, the batch stays an array); the
// positional form is what every consumer decodes (llm-d's and Dynamo's
// accept both), so it is the one published, and Decode accepts both.

// AppendBatch appends the msgpack encoding of b to dst.
func AppendBatch(dst []byte, b *Batch) []byte {
	if b.HasRank {
		dst = appendArrayLen(dst, 3)
	} else {
		dst = appendArrayLen(dst, 2)
	}
	dst = appendFloat64(dst, b.TS)
	dst = appendArrayLen(dst, len(b.Events))
	for i := range b.Events {
		dst = appendEvent(dst, &b.Events[i])
	}
	if b.HasRank {
		dst = appendInt(dst, int64(b.DataParallelRank))
	}
	return dst
}

func appendEvent(dst []byte, e *Event) []byte {
	switch e.Kind {
	case BlockStored:
		dst = appendArrayLen(dst, 8)
		dst = appendStr(dst, "BlockStored")
		dst = appendHashes(dst, e.Hashes)
		if e.HasParent {
			dst = appendUint(dst, e.Parent)
		} else {
			dst = append(dst, mpNil)
		}
		dst = appendArrayLen(dst, len(e.Tokens))
		for _, t := range e.Tokens {
			dst = appendInt(dst, int64(t))
		}
		dst = appendInt(dst, int64(e.BlockSize))
		dst = append(dst, mpNil) // lora_id
		dst = appendOptStr(dst, e.Medium)
		dst = append(dst, mpNil) // lora_name
	case BlockRemoved:
		dst = appendArrayLen(dst, 3)
		dst = appendStr(dst, "BlockRemoved")
		dst = appendHashes(dst, e.Hashes)
		dst = appendOptStr(dst, e.Medium)
	default:
		dst = appendArrayLen(dst, 1)
		dst = appendStr(dst, "AllBlocksCleared")
	}
	return dst
}

func appendHashes(dst []byte, hs []uint64) []byte {
	dst = appendArrayLen(dst, len(hs))
	for _, h := range hs {
		dst = appendUint(dst, h)
	}
	return dst
}

// msgpack format bytes (https://github.com/msgpack/msgpack/blob/master/spec.md).
const (
	mpNil      = 0xc0
	mpFalse    = 0xc2
	mpTrue     = 0xc3
	mpBin8     = 0xc4
	mpBin16    = 0xc5
	mpBin32    = 0xc6
	mpExt8     = 0xc7
	mpExt16    = 0xc8
	mpExt32    = 0xc9
	mpFloat32  = 0xca
	mpFloat64  = 0xcb
	mpUint8    = 0xcc
	mpUint16   = 0xcd
	mpUint32   = 0xce
	mpUint64   = 0xcf
	mpInt8     = 0xd0
	mpInt16    = 0xd1
	mpInt32    = 0xd2
	mpInt64    = 0xd3
	mpFixExt1  = 0xd4
	mpFixExt2  = 0xd5
	mpFixExt4  = 0xd6
	mpFixExt8  = 0xd7
	mpFixExt16 = 0xd8
	mpStr8     = 0xd9
	mpStr16    = 0xda
	mpStr32    = 0xdb
	mpArray16  = 0xdc
	mpArray32  = 0xdd
	mpMap16    = 0xde
	mpMap32    = 0xdf
)

func appendArrayLen(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= math.MaxUint16:
		return append(dst, mpArray16, byte(n>>8), byte(n))
	default:
		return binary.BigEndian.AppendUint32(append(dst, mpArray32), uint32(n))
	}
}

func appendUint(dst []byte, v uint64) []byte {
	switch {
	case v < 128:
		return append(dst, byte(v))
	case v <= math.MaxUint8:
		return append(dst, mpUint8, byte(v))
	case v <= math.MaxUint16:
		return append(dst, mpUint16, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, mpUint32), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(dst, mpUint64), v)
	}
}

// appendInt writes v as msgspec does: non-negative values as unsigned, the
// rest in the smallest signed form.
func appendInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(dst, uint64(v))
	case v >= -32:
		return append(dst, byte(v))
	case v >= math.MinInt8:
		return append(dst, mpInt8, byte(v))
	case v >= math.MinInt16:
		return append(dst, mpInt16, byte(v>>8), byte(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, mpInt32), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(dst, mpInt64), uint64(v))
	}
}

func appendFloat64(dst []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, mpFloat64), math.Float64bits(f))
}

func appendStr(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		dst = append(dst, mpStr8, byte(n))
	case n <= math.MaxUint16:
		dst = append(dst, mpStr16, byte(n>>8), byte(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, mpStr32), uint32(n))
	}
	return append(dst, s...)
}

func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, mpNil)
	}
	return appendStr(dst, s)
}

// Decoding faces the network: every length is checked against the bytes
// that are left before anything is allocated, nesting is bounded, and
// anything that does not fit the schema is an error, never a panic.

// ErrMalformed wraps every decoding error.
var ErrMalformed = errors.New("kvevents: malformed event batch")

// maxDepth bounds the nesting of values Decode skips (unknown fields).
const maxDepth = 32

// DecodeBatch decodes a KVEventBatch payload: the positional form Tandem and
// vLLM before PR #42892 publish, events as maps with a "type" key (vLLM
// after it), or a batch that is itself a map. Unknown event tags and unknown
// fields are skipped, so newer engines' additions do not break it; an
// event's known fields of the wrong type are an error.
func DecodeBatch(payload []byte) (*Batch, error) {
	r := reader{b: payload}
	b, err := r.batch()
	if err == nil && r.off != len(r.b) {
		err = fmt.Errorf("%d bytes after the batch", len(r.b)-r.off)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return b, nil
}

type reader struct {
	b   []byte
	off int
}

var errShort = errors.New("truncated")

func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errShort
	}
	return r.b[r.off], nil
}

func (r *reader) take(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.off {
		return nil, errShort
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p, nil
}

func (r *reader) byte1() (byte, error) {
	p, err := r.take(1)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

// uintN reads an n-byte big-endian unsigned integer (n ≤ 8).
func (r *reader) uintN(n int) (uint64, error) {
	p, err := r.take(n)
	if err != nil {
		return 0, err
	}
	var v uint64
	for _, c := range p {
		v = v<<8 | uint64(c)
	}
	return v, nil
}

// count checks a collection length against the bytes left: every element
// takes at least min bytes.
func (r *reader) count(n uint64, min int) (int, error) {
	if n > uint64(len(r.b)-r.off)/uint64(min) {
		return 0, fmt.Errorf("length %d exceeds the %d bytes left", n, len(r.b)-r.off)
	}
	return int(n), nil
}

func (r *reader) arrayLen() (int, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c&0xf0 == 0x90:
		n = uint64(c & 0x0f)
	case c == mpArray16:
		n, err = r.uintN(2)
	case c == mpArray32:
		n, err = r.uintN(4)
	default:
		return 0, fmt.Errorf("want an array, got 0x%02x", c)
	}
	if err != nil {
		return 0, err
	}
	return r.count(n, 1)
}

// mapOrArray reads the header of a map or an array.
func (r *reader) mapOrArray() (n int, isMap bool, err error) {
	c, err := r.peek()
	if err != nil {
		return 0, false, err
	}
	var m uint64
	switch {
	case c&0xf0 == 0x80:
		r.off++
		m = uint64(c & 0x0f)
	case c == mpMap16:
		r.off++
		m, err = r.uintN(2)
	case c == mpMap32:
		r.off++
		m, err = r.uintN(4)
	default:
		n, err = r.arrayLen()
		return n, false, err
	}
	if err != nil {
		return 0, false, err
	}
	n, err = r.count(m, 2)
	return n, true, err
}

func (r *reader) isNil() bool {
	if r.off < len(r.b) && r.b[r.off] == mpNil {
		r.off++
		return true
	}
	return false
}

// int reads any msgpack integer that fits an int64, or a uint64 above it
// as its two's complement (for hashes).
func (r *reader) int() (int64, error) {
	c, err := r.byte1()
	if err != nil {
		return 0, err
	}
	switch {
	case c < 0x80:
		return int64(c), nil
	case c >= 0xe0:
		return int64(int8(c)), nil
	}
	var v uint64
	switch c {
	case mpUint8, mpInt8:
		v, err = r.uintN(1)
		if c == mpInt8 {
			return int64(int8(v)), err
		}
	case mpUint16, mpInt16:
		v, err = r.uintN(2)
		if c == mpInt16 {
			return int64(int16(v)), err
		}
	case mpUint32, mpInt32:
		v, err = r.uintN(4)
		if c == mpInt32 {
			return int64(int32(v)), err
		}
	case mpUint64, mpInt64:
		v, err = r.uintN(8)
	default:
		return 0, fmt.Errorf("want an integer, got 0x%02x", c)
	}
	return int64(v), err
}

func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case mpFloat64:
		r.off++
		v, err := r.uintN(8)
		return math.Float64frombits(v), err
	case mpFloat32:
		r.off++
		v, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(v))), err
	}
	v, err := r.int()
	return float64(v), err
}

// raw reads a str or bin value's bytes (not copied).
func (r *reader) raw() ([]byte, error) {
	c, err := r.byte1()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c&0xe0 == 0xa0:
		n = uint64(c & 0x1f)
	case c == mpStr8 || c == mpBin8:
		n, err = r.uintN(1)
	case c == mpStr16 || c == mpBin16:
		n, err = r.uintN(2)
	case c == mpStr32 || c == mpBin32:
		n, err = r.uintN(4)
	default:
		return nil, fmt.Errorf("want a string, got 0x%02x", c)
	}
	if err != nil {
		return nil, err
	}
	if n > uint64(len(r.b)-r.off) {
		return nil, errShort
	}
	return r.take(int(n))
}

func (r *reader) optStr() (string, error) {
	if r.isNil() {
		return "", nil
	}
	p, err := r.raw()
	return string(p), err
}

// hash reads a block hash: an integer (vLLM's default) or the digest's bytes
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0), folded to the same 64 bits: the
// last 8 bytes, big-endian, zero-padded on the left when shorter.
func (r *reader) hash() (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if c&0xe0 == 0xa0 || (c >= mpBin8 && c <= mpBin32) || (c >= mpStr8 && c <= mpStr32) {
		p, err := r.raw()
		if err != nil {
			return 0, err
		}
		if len(p) == 0 {
			return 0, errors.New("empty block hash")
		}
		var v uint64
		for _, b := range p[max(0, len(p)-8):] {
			v = v<<8 | uint64(b)
		}
		return v, nil
	}
	v, err := r.int()
	return uint64(v), err
}

func (r *reader) hashes() ([]uint64, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		if out[i], err = r.hash(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (r *reader) tokens() ([]int32, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	out := make([]int32, n)
	for i := range out {
		v, err := r.int()
		if err != nil {
			return nil, err
		}
		if v < math.MinInt32 || v > math.MaxInt32 {
			return nil, fmt.Errorf("token id %d out of range", v)
		}
		out[i] = int32(v)
	}
	return out, nil
}

// skip skips one value of any type.
func (r *reader) skip(depth int) error {
	if depth > maxDepth {
		return errors.New("nesting too deep")
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	switch {
	case c < 0x80 || c >= 0xe0 || c == mpNil || c == mpFalse || c == mpTrue:
		r.off++
		return nil
	case c&0xf0 == 0x80 || c == mpMap16 || c == mpMap32:
		n, _, err := r.mapOrArray()
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c&0xf0 == 0x90 || c == mpArray16 || c == mpArray32:
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		for range n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c&0xe0 == 0xa0 || (c >= mpBin8 && c <= mpBin32) || (c >= mpStr8 && c <= mpStr32):
		_, err := r.raw()
		return err
	case c == mpFloat32 || c == mpFloat64:
		_, err := r.float()
		return err
	case c >= mpUint8 && c <= mpInt64:
		_, err := r.int()
		return err
	case c >= mpFixExt1 && c <= mpFixExt16:
		_, err := r.take(2 + 1<<(c-mpFixExt1))
		return err
	case c >= mpExt8 && c <= mpExt32:
		r.off++
		n, err := r.uintN(1 << (c - mpExt8))
		if err != nil {
			return err
		}
		if n > uint64(len(r.b)-r.off) {
			return errShort
		}
		_, err = r.take(int(n) + 1)
		return err
	}
	return fmt.Errorf("unknown msgpack byte 0x%02x", c)
}

func (r *reader) batch() (*Batch, error) {
	n, isMap, err := r.mapOrArray()
	if err != nil {
		return nil, err
	}
	b := &Batch{}
	field := func(name string) error {
		switch name {
		case "ts":
			b.TS, err = r.float()
		case "events":
			b.Events, err = r.events()
		case "data_parallel_rank":
			if r.isNil() {
				return nil
			}
			var v int64
			v, err = r.int()
			b.DataParallelRank, b.HasRank = int(v), true
		default:
			err = r.skip(0)
		}
		return err
	}
	sawEvents := false
	for i := range n {
		var name string
		if isMap {
			p, err := r.raw()
			if err != nil {
				return nil, err
			}
			name = string(p)
		} else if i < 3 {
			name = [...]string{"ts", "events", "data_parallel_rank"}[i]
		}
		sawEvents = sawEvents || name == "events"
		if err := field(name); err != nil {
			return nil, fmt.Errorf("batch field %q: %w", name, err)
		}
	}
	if !sawEvents {
		return nil, errors.New("batch without events")
	}
	return b, nil
}

func (r *reader) events() ([]Event, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	out := make([]Event, 0, n)
	for i := range n {
		e, ok, err := r.event()
		if err != nil {
			return nil, fmt.Errorf("event %d: %w", i, err)
		}
		if ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// storedFields and removedFields are the positional fields after the tag.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}
	removedFields = []string{"block_hashes", "medium"}
)

// event reads one event; ok is false for an unknown tag (skipped).
func (r *reader) event() (e Event, ok bool, err error) {
	n, isMap, err := r.mapOrArray()
	if err != nil {
		return e, false, err
	}
	if isMap {
		return r.mapEvent(n)
	}
	if n == 0 {
		return e, false, errors.New("event without a tag")
	}
	tag, err := r.raw()
	if err != nil {
		return e, false, fmt.Errorf("tag: %w", err)
	}
	var names []string
	switch string(tag) {
	case "BlockStored":
		e.Kind, names = BlockStored, storedFields
	case "BlockRemoved":
		e.Kind, names = BlockRemoved, removedFields
	case "AllBlocksCleared":
		e.Kind = AllBlocksCleared
	}
	for i := 1; i < n; i++ {
		name := ""
		if e.Kind != 0 && i-1 < len(names) {
			name = names[i-1]
		}
		if err := r.eventField(&e, name); err != nil {
			return e, false, fmt.Errorf("%s field %q: %w", tag, name, err)
		}
	}
	if e.Kind == BlockStored && n < 5 || e.Kind == BlockRemoved && n < 2 {
		return e, false, fmt.Errorf("%s with %d fields", tag, n-1)
	}
	return e, e.Kind != 0, nil
}

func (r *reader) mapEvent(n int) (e Event, ok bool, err error) {
	var tag string
	sawHashes := false
	for range n {
		p, err := r.raw()
		if err != nil {
			return e, false, fmt.Errorf("field name: %w", err)
		}
		name := string(p)
		if name == "type" {
			t, err := r.raw()
			if err != nil {
				return e, false, fmt.Errorf("type: %w", err)
			}
			tag = string(t)
			continue
		}
		sawHashes = sawHashes || name == "block_hashes"
		if err := r.eventField(&e, name); err != nil {
			return e, false, fmt.Errorf("field %q: %w", name, err)
		}
	}
	switch tag {
	case "BlockStored":
		e.Kind = BlockStored
	case "BlockRemoved":
		e.Kind = BlockRemoved
	case "AllBlocksCleared":
		return Event{Kind: AllBlocksCleared}, true, nil
	case "":
		return e, false, errors.New("event map without a type")
	default:
		return Event{}, false, nil
	}
	if !sawHashes {
		return e, false, fmt.Errorf("%s without block_hashes", tag)
	}
	return e, true, nil
}

func (r *reader) eventField(e *Event, name string) (err error) {
	switch name {
	case "block_hashes":
		e.Hashes, err = r.hashes()
	case "parent_block_hash":
		if !r.isNil() {
			e.Parent, err = r.hash()
			e.HasParent = true
		}
	case "token_ids":
		e.Tokens, err = r.tokens()
	case "block_size":
		var v int64
		v, err = r.int()
		if err == nil && (v < 0 || v > math.MaxInt32) {
			err = fmt.Errorf("block size %d out of range", v)
		}
		e.BlockSize = int(v)
	case "medium":
		e.Medium, err = r.optStr()
	default:
		err = r.skip(0)
	}
	return err
}
