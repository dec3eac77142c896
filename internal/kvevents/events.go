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
// accept both), so it is the one published, and DecodeBatch accepts both.

// AppendBatch appends the msgpack encoding of b to dst.
func AppendBatch(dst []byte, b *Batch) []byte {
	if b.HasRank {
		dst = msgp.AppendArrayHeader(dst, 3)
	} else {
		dst = msgp.AppendArrayHeader(dst, 2)
	}
	dst = msgp.AppendFloat64(dst, b.TS)
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
		dst = msgp.AppendArrayHeader(dst, 8)
		dst = msgp.AppendString(dst, "BlockStored")
		dst = appendHashes(dst, e.Hashes)
		if e.HasParent {
			dst = msgp.AppendUint64(dst, e.Parent)
		} else {
			dst = msgp.AppendNil(dst)
		}
		dst = appendArrayLen(dst, len(e.Tokens))
		for _, t := range e.Tokens { // appendInt, unrolled: this loop is most of the encoding's time
			if t >= 0 {
				dst = appendSmallUint(dst, uint64(t))
			} else {
				dst = msgp.AppendInt64(dst, int64(t))
			}
		}
		dst = appendInt(dst, int64(e.BlockSize))
		dst = msgp.AppendNil(dst) // lora_id
		dst = appendOptStr(dst, e.Medium)
		dst = msgp.AppendNil(dst) // lora_name
	case BlockRemoved:
		dst = msgp.AppendArrayHeader(dst, 3)
		dst = msgp.AppendString(dst, "BlockRemoved")
		dst = appendHashes(dst, e.Hashes)
		dst = appendOptStr(dst, e.Medium)
	default:
		dst = msgp.AppendArrayHeader(dst, 1)
		dst = msgp.AppendString(dst, "AllBlocksCleared")
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
