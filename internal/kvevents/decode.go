package kvevents

import (
	"errors"
	"fmt"
	"math"

	"github.com/tinylib/msgp/msgp"
)

// Decoding faces the network: every length is checked against the bytes
// that are left before anything is allocated (msgpack.go), nesting is
// bounded, and anything that does not fit the schema is an error, never a
// panic.

// ErrMalformed wraps every decoding error.
var ErrMalformed = errors.New("kvevents: malformed event batch")

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
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
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
	case "group_idx", "kv_cache_spec_sliding_window":
		if r.isNil() {
			break
		}
		var v int64
		v, err = r.int()
		if err == nil && (v < 0 || v > math.MaxInt32) {
			err = fmt.Errorf("%s %d out of range", name, v)
		}
		if name == "group_idx" {
			e.Group, e.HasGroup = int(v), true
		} else {
			e.Window = int(v)
		}
	default:
		err = r.skip(0)
	}
	return err
}

// hash reads a block hash: an integer (vLLM's default) or the digest's bytes
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0), folded to the same 64 bits: the
// last 8 bytes, big-endian, zero-padded on the left when shorter.
func (r *reader) hash() (uint64, error) {
	switch msgp.NextType(r.left()) {
	case msgp.StrType, msgp.BinType:
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
	case msgp.UintType: // half of all hashes are past int64
		return r.uint()
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
