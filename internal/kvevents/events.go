package kvevents

import (
	"fmt"

	"github.com/tinylib/msgp/msgp"
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

// String is the event's vLLM tag (BlockStored, ...).
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
	// Group is the KV-cache group of the blocks (group_idx), valid when
	// HasGroup (an engine with hybrid KV-cache groups; none encodes as
	// None: one group). Window is that group's sliding window
	// (kv_cache_spec_sliding_window, BlockStored only; 0: full attention,
	// kv_cache_spec_kind "full_attention").
	Group    int
	HasGroup bool
	Window   int
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

// The wire layout, matched field for field to vLLM's msgspec structs in
// vllm/distributed/kv_events.py (EventBatch, KVCacheEvent and its
// subclasses). The batch is array_like: a msgpack array of its fields in
// declaration order. The events are tagged (tag=True, the tag the class
// name) with omit_defaults, which leaves out fields still at their defaults;
// fields without a default (lora_id, medium, lora_name) are always present,
// as nil when None. vLLM 0.32 writes each event as a map (EncodingMap), the
// tag under "type" first, then the fields in declaration order:
//
//	KVEventBatch     [ts float64, [event...], data_parallel_rank]
//	BlockStored      {"type": "BlockStored", "block_hashes": [hash...], "parent_block_hash": parent|nil, "token_ids": [token...], "block_size": n, "lora_id": nil, "medium": medium, "lora_name": nil}
//	BlockRemoved     {"type": "BlockRemoved", "block_hashes": [hash...], "medium": medium}
//	AllBlocksCleared {"type": "AllBlocksCleared"}
//
// Earlier vLLM declared the events array_like too (EncodingArray): the same
// values in the same order, positionally, the tag first and the trailing
// fields at their defaults left out:
//
//	BlockStored      ["BlockStored", [hash...], parent|nil, [token...], block_size, lora_id=nil, medium, lora_name=nil]
//	BlockRemoved     ["BlockRemoved", [hash...], medium]
//	AllBlocksCleared ["AllBlocksCleared"]
//
// extra_keys, group_idx, kv_cache_spec_* and the later fields default to
// None and are left out (no LoRA, no multimodal keys), except that the
// events of an engine with hybrid KV-cache groups (Event.HasGroup) carry
// group_idx, and a BlockStored its kv_cache_spec_kind ("full_attention" or
// "sliding_window") and kv_cache_spec_sliding_window (sliding only):
//
//	BlockStored      {..., "lora_name": nil, "group_idx": g, "kv_cache_spec_kind": kind[, "kv_cache_spec_sliding_window": w]}
//	BlockStored      [..., lora_name=nil, extra_keys=nil, g, kind[, w]]
//	BlockRemoved     {"type": "BlockRemoved", "block_hashes": [hash...], "medium": medium, "group_idx": g}
//	BlockRemoved     ["BlockRemoved", [hash...], medium, g]
// msgspec writes floats as float64 and integers, strings, maps and arrays in
// their smallest msgpack form; the encoder below does the same, so its bytes
// equal msgspec's in either form. vLLM PR #42892 (2026) dropped array_like
// from the event structs; DecodeBatch accepts both forms.

// AppendBatch appends the msgpack encoding of b, its events in form enc, to
// dst.
func AppendBatch(dst []byte, b *Batch, enc Encoding) []byte {
	if b.HasRank {
		dst = msgp.AppendArrayHeader(dst, 3)
	} else {
		dst = msgp.AppendArrayHeader(dst, 2)
	}
	dst = msgp.AppendFloat64(dst, b.TS)
	dst = appendArrayLen(dst, len(b.Events))
	m := enc == EncodingMap
	for i := range b.Events {
		dst = appendEvent(dst, &b.Events[i], m)
	}
	if b.HasRank {
		dst = appendInt(dst, int64(b.DataParallelRank))
	}
	return dst
}

// appendEvent writes e as a map (m) or an array. The keys are msgpack
// fixstrs, written as constants: a map costs a few appends more per event,
// nothing per block.
func appendEvent(dst []byte, e *Event, m bool) []byte {
	switch e.Kind {
	case BlockStored:
		extra := 0 // group fields
		if e.HasGroup {
			extra = 2
			if e.Window > 0 {
				extra = 3
			}
		}
		switch {
		case m:
			dst = append(dst, byte(0x88+extra))
			dst = append(dst, "\xa4type\xabBlockStored\xacblock_hashes"...)
		case extra > 0:
			dst = append(dst, byte(0x99+extra)) // extra_keys too, as nil
			dst = append(dst, "\xabBlockStored"...)
		default:
			dst = append(dst, "\x98\xabBlockStored"...)
		}
		dst = appendHashes(dst, e.Hashes)
		if m {
			dst = append(dst, "\xb1parent_block_hash"...)
		}
		if e.HasParent {
			dst = msgp.AppendUint64(dst, e.Parent)
		} else {
			dst = msgp.AppendNil(dst)
		}
		if m {
			dst = append(dst, "\xa9token_ids"...)
		}
		dst = appendArrayLen(dst, len(e.Tokens))
		for _, t := range e.Tokens { // appendInt, unrolled: this loop is most of the encoding's time
			if t >= 0 {
				dst = appendSmallUint(dst, uint64(t))
			} else {
				dst = msgp.AppendInt64(dst, int64(t))
			}
		}
		if m {
			dst = append(dst, "\xaablock_size"...)
		}
		dst = appendInt(dst, int64(e.BlockSize))
		if m {
			dst = append(dst, "\xa7lora_id\xc0\xa6medium"...)
		} else {
			dst = msgp.AppendNil(dst) // lora_id
		}
		dst = appendOptStr(dst, e.Medium)
		if m {
			dst = append(dst, "\xa9lora_name\xc0"...)
		} else {
			dst = msgp.AppendNil(dst) // lora_name
		}
		if e.HasGroup {
			if m {
				dst = append(dst, "\xa9group_idx"...)
			} else {
				dst = msgp.AppendNil(dst) // extra_keys
			}
			dst = appendInt(dst, int64(e.Group))
			if m {
				dst = append(dst, "\xb2kv_cache_spec_kind"...)
			}
			if e.Window > 0 {
				dst = append(dst, "\xaesliding_window"...)
				if m {
					dst = append(dst, "\xbckv_cache_spec_sliding_window"...)
				}
				dst = appendInt(dst, int64(e.Window))
			} else {
				dst = append(dst, "\xaefull_attention"...)
			}
		}
	case BlockRemoved:
		switch {
		case m && e.HasGroup:
			dst = append(dst, "\x84\xa4type\xacBlockRemoved\xacblock_hashes"...)
		case m:
			dst = append(dst, "\x83\xa4type\xacBlockRemoved\xacblock_hashes"...)
		case e.HasGroup:
			dst = append(dst, "\x94\xacBlockRemoved"...)
		default:
			dst = append(dst, "\x93\xacBlockRemoved"...)
		}
		dst = appendHashes(dst, e.Hashes)
		if m {
			dst = append(dst, "\xa6medium"...)
		}
		dst = appendOptStr(dst, e.Medium)
		if e.HasGroup {
			if m {
				dst = append(dst, "\xa9group_idx"...)
			}
			dst = appendInt(dst, int64(e.Group))
		}
	default:
		if m {
			dst = append(dst, "\x81\xa4type\xb0AllBlocksCleared"...)
		} else {
			dst = append(dst, "\x91\xb0AllBlocksCleared"...)
		}
	}
	return dst
}

func appendHashes(dst []byte, hs []uint64) []byte {
	dst = appendArrayLen(dst, len(hs))
	for _, h := range hs {
		if h >= 1<<32 { // most hashes: msgpack's uint64, inline
			dst = append(dst, 0xcf, byte(h>>56), byte(h>>48), byte(h>>40), byte(h>>32), byte(h>>24), byte(h>>16), byte(h>>8), byte(h))
		} else {
			dst = msgp.AppendUint64(dst, h)
		}
	}
	return dst
}

// appendSmallUint appends v in msgpack's smallest unsigned encoding, the
// bytes msgp.AppendUint64 writes, inline for the sizes token ids take
// (msgp's call is not inlined and was a fifth of the encoding's time).
func appendSmallUint(dst []byte, v uint64) []byte {
	switch {
	case v < 1<<7:
		return append(dst, byte(v))
	case v < 1<<8:
		return append(dst, 0xcc, byte(v))
	case v < 1<<16:
		return append(dst, 0xcd, byte(v>>8), byte(v))
	}
	return msgp.AppendUint64(dst, v)
}
