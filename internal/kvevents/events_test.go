package kvevents

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// goldenBatch and goldenBytes: a KVEventBatch and the bytes vLLM's
// msgspec encoder produces for it. The layout is msgspec's for the structs of
// vllm/distributed/kv_events.py: array_like=True and tag=True on
// KVCacheEvent (lines 32-38 at commit b4e69e0af33f4698e157a262cc787fe61983cd3d,
// EventBatch lines 22-29, BlockStored lines 41-46, BlockRemoved 49-50,
// AllBlocksCleared 53-54), with the fields added since in declaration order
// (at commit 0181ea3173e53eea8cf04a86891488e3dc89bb34: EventBatch's
// data_parallel_rank; BlockStored's medium and lora_name, which have no
// default and so are always encoded; extra_keys, group_idx and
// kv_cache_spec_* default to None and are omitted when trailing).
var goldenBatch = Batch{
	TS: 1700000000.5,
	Events: []Event{
		{Kind: BlockStored, Hashes: []uint64{1, 0xfedcba9876543210}, Tokens: []int32{1, 200, 40000, 70000}, BlockSize: 2, Medium: MediumGPU},
		{Kind: BlockRemoved, Hashes: []uint64{300}, Medium: MediumGPU},
		{Kind: AllBlocksCleared},
	},
	HasRank: true,
}

var goldenBytes = strings.Join([]string{
	"93",                                 // KVEventBatch: array of 3
	"cb41d954fc40200000",                 // ts: float64 (msgspec always writes floats as float64)
	"93",                                 // events: array of 3
	"98",                                 // BlockStored: array of 8, tag first
	"ab426c6f636b53746f726564",           // "BlockStored" (fixstr 11)
	"9201cffedcba9876543210",             // block_hashes: [1, uint64 0xfedcba9876543210]
	"c0",                                 // parent_block_hash: None
	"9401ccc8cd9c40ce00011170",           // token_ids: [1, uint8 200, uint16 40000, uint32 70000]
	"02",                                 // block_size: 2
	"c0",                                 // lora_id: None
	"a3475055",                           // medium: "GPU"
	"c0",                                 // lora_name: None
	"93",                                 // BlockRemoved: array of 3
	"ac426c6f636b52656d6f766564",         // "BlockRemoved"
	"91cd012c",                           // block_hashes: [uint16 300]
	"a3475055",                           // medium: "GPU"
	"91",                                 // AllBlocksCleared: array of 1
	"b0416c6c426c6f636b73436c6561726564", // "AllBlocksCleared" (fixstr 16)
	"00",                                 // data_parallel_rank: 0
}, "")

func TestAppendBatchMatchesMsgspecBytes(t *testing.T) {
	got := hex.EncodeToString(AppendBatch(nil, &goldenBatch, EncodingArray))
	if got != goldenBytes {
		t.Fatalf("encoding differs from msgspec's\n got %s\nwant %s", got, goldenBytes)
	}
}

// goldenMapBytes: goldenBatch as vLLM 0.32 encodes it, events as maps (the
// same values as goldenBytes, each after its field name).
var goldenMapBytes = strings.Join([]string{
	"93",                 // KVEventBatch: array of 3 (still array_like)
	"cb41d954fc40200000", // ts
	"93",                 // events: array of 3
	"88",                 // BlockStored: map of 8
	"a474797065" + "ab426c6f636b53746f726564",               // "type": "BlockStored"
	"ac626c6f636b5f686173686573" + "9201cffedcba9876543210", // "block_hashes": [1, 0xfedcba9876543210]
	"b1706172656e745f626c6f636b5f68617368" + "c0",           // "parent_block_hash": None
	"a9746f6b656e5f696473" + "9401ccc8cd9c40ce00011170",     // "token_ids": [1, 200, 40000, 70000]
	"aa626c6f636b5f73697a65" + "02",                         // "block_size": 2
	"a76c6f72615f6964" + "c0",                               // "lora_id": None
	"a66d656469756d" + "a3475055",                           // "medium": "GPU"
	"a96c6f72615f6e616d65" + "c0",                           // "lora_name": None
	"83",                                                    // BlockRemoved: map of 3
	"a474797065" + "ac426c6f636b52656d6f766564",             // "type": "BlockRemoved"
	"ac626c6f636b5f686173686573" + "91cd012c",               // "block_hashes": [300]
	"a66d656469756d" + "a3475055",                           // "medium": "GPU"
	"81",                                                    // AllBlocksCleared: map of 1
	"a474797065" + "b0416c6c426c6f636b73436c6561726564",     // "type": "AllBlocksCleared"
	"00", // data_parallel_rank: 0
}, "")

func TestAppendBatchMapFormMatchesMsgspecBytes(t *testing.T) {
	got := hex.EncodeToString(AppendBatch(nil, &goldenBatch, EncodingMap))
	if got != goldenMapBytes {
		t.Fatalf("encoding differs from msgspec's\n got %s\nwant %s", got, goldenMapBytes)
	}
}

func TestDecodeBatchRoundTrips(t *testing.T) {
	tests := []struct {
		name string
		b    Batch
	}{
		{"the golden batch", goldenBatch},
		{"a store with a parent and large values", Batch{TS: -1.25, Events: []Event{{Kind: BlockStored, Hashes: make([]uint64, 300), Parent: 1 << 63, HasParent: true, Tokens: make([]int32, 70000), BlockSize: 16}}, DataParallelRank: 3, HasRank: true}},
		{"a batch without rank or events", Batch{TS: 5, Events: []Event{}}},
		{"negative token ids", Batch{Events: []Event{{Kind: BlockStored, Hashes: []uint64{7}, Tokens: []int32{-1, -100, -40000, -1 << 31}, BlockSize: 4}}, HasRank: true}},
	}
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		for _, tc := range tests {
			t.Run(enc.String()+"/"+tc.name, func(t *testing.T) {
				got, err := DecodeBatch(AppendBatch(nil, &tc.b, enc))
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(&tc.b, got); diff != "" {
					t.Errorf("round trip (-want +got):\n%s", diff)
				}
			})
		}
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeAcceptsWhatOtherPublishersSend(t *testing.T) {
	tests := []struct {
		name string
		hex  string
		want *Batch
	}{
		{
			// vLLM after PR #42892: events are maps with a "type" key, in any
			// order, with group_idx (read) and fields Tandem does not know.
			name: "map-encoded events",
			hex: "93 cb3ff0000000000000 92" +
				"85 a474797065 ab426c6f636b53746f726564 ac626c6f636b5f686173686573 9105 a9746f6b656e5f696473 920102 aa626c6f636b5f73697a65 02 a967726f75705f696478 00" +
				"82 a474797065 ac426c6f636b52656d6f766564 ac626c6f636b5f686173686573 9105" +
				" 00",
			want: &Batch{TS: 1, Events: []Event{
				{Kind: BlockStored, Hashes: []uint64{5}, Tokens: []int32{1, 2}, BlockSize: 2, HasGroup: true},
				{Kind: BlockRemoved, Hashes: []uint64{5}},
			}, HasRank: true},
		},
		{
			// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: the digest's bytes,
			// folded to their last 8 bytes big-endian like the integer form.
			name: "hashes as bytes",
			hex:  "92 cb0000000000000000 91 93 ac426c6f636b52656d6f766564 92 c40a00000000000000000102 c40103 c0",
			want: &Batch{Events: []Event{{Kind: BlockRemoved, Hashes: []uint64{0x0102, 3}}}},
		},
		{
			name: "an older BlockStored without medium and lora_name, an unknown event, extra trailing fields",
			hex:  "93 cb0000000000000000 93 96ab426c6f636b53746f726564 9101 c0 9101 01 c0 92a3466f6f01 93ac426c6f636b52656d6f766564 9102 c0 c0",
			want: &Batch{Events: []Event{{Kind: BlockStored, Hashes: []uint64{1}, Tokens: []int32{1}, BlockSize: 1}, {Kind: BlockRemoved, Hashes: []uint64{2}}}},
		},
		{
			name: "a batch encoded as a map",
			hex:  "82 a27473 01 a66576656e7473 9191b0416c6c426c6f636b73436c6561726564",
			want: &Batch{TS: 1, Events: []Event{{Kind: AllBlocksCleared}}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeBatch(mustHex(t, tc.hex))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decoded (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeRefusesMalformedPayloads(t *testing.T) {
	golden := mustHex(t, goldenBytes)
	tests := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"truncated", golden[:len(golden)-2]},
		{"trailing bytes", append(append([]byte(nil), golden...), 0)},
		{"an array claiming 4 billion events", mustHex(t, "92 cb0000000000000000 ddffffffff")},
		{"a string longer than the payload", mustHex(t, "92 cb0000000000000000 91 91 dbffffff00")},
		{"a batch without events", mustHex(t, "91 cb0000000000000000")},
		{"an event without a tag", mustHex(t, "92 cb0000000000000000 91 90")},
		{"a BlockStored missing fields", mustHex(t, "92 cb0000000000000000 91 92 ab426c6f636b53746f726564 90")},
		{"a token id beyond int32", mustHex(t, "92 cb0000000000000000 91 95 ab426c6f636b53746f726564 90 c0 91ce80000000 01")},
		{"a map event without a type", mustHex(t, "92 cb0000000000000000 91 81 ac626c6f636b5f686173686573 90")},
		{"deep nesting in an unknown field", append(mustHex(t, "92 cb0000000000000000 91 92 a3466f6f"), bytes.Repeat([]byte{0x91}, 100)...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := DecodeBatch(tc.b); !errors.Is(err, ErrMalformed) {
				t.Fatalf("DecodeBatch = %v, want ErrMalformed", err)
			}
		})
	}
}

// FuzzDecodeBatch: the decoder faces the network; whatever it is given, it
// returns a batch or ErrMalformed, and a batch it accepts survives
// re-encoding.
func FuzzDecodeBatch(f *testing.F) {
	f.Add(AppendBatch(nil, &goldenBatch, EncodingArray))
	f.Add(AppendBatch(nil, &goldenBatch, EncodingMap))
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90})
	f.Add(mustHexF(f, "93 cb3ff0000000000000 91 82 a474797065 ac426c6f636b52656d6f766564 ac626c6f636b5f686173686573 9105 00"))
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := DecodeBatch(payload)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		for i := range b.Events {
			e := &b.Events[i]
			if e.Kind == AllBlocksCleared {
				*e = Event{Kind: AllBlocksCleared}
			}
			if e.Kind == BlockRemoved {
				e.Tokens, e.BlockSize, e.Parent, e.HasParent = nil, 0, 0, false
			}
		}
		for _, enc := range []Encoding{EncodingMap, EncodingArray} {
			again, err := DecodeBatch(AppendBatch(nil, b, enc))
			if err != nil {
				t.Fatalf("re-encoded batch (%s form) does not decode: %v", enc, err)
			}
			if diff := cmp.Diff(b, again, cmpopts.EquateEmpty(), cmp.Comparer(func(x, y float64) bool { return x == y || x != x && y != y })); diff != "" {
				t.Fatalf("re-encoding (%s form) changed the batch (-first +second):\n%s", enc, diff)
			}
		}
	})
}

func mustHexF(f *testing.F, s string) []byte {
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// TestAppendBatchBytesAtTheFormatBoundaries pins the encoder's choice of
// msgpack form at every size boundary (fixint/uint8/16/32/64, negative
// fixint/int8/16/32, fixstr/str8/16/32, fixarray/array16/32): msgspec
// writes the smallest form, and so must any change of the encoder. The
// small batch is spelled out; the large one, with lengths past 2^16, is
// pinned by its length and SHA-256.
func TestAppendBatchBytesAtTheFormatBoundaries(t *testing.T) {
	small := Batch{TS: 0.1, Events: []Event{
		{Kind: BlockStored, Hashes: []uint64{0, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, 1<<64 - 1}, Parent: 1<<63 | 5, HasParent: true,
			Tokens: []int32{127, 128, 255, 256, 65535, 65536, 1<<31 - 1, -1, -32, -33, -128, -129, -32768, -32769, -1 << 31}, BlockSize: 65536, Medium: strings.Repeat("m", 31)},
		{Kind: BlockRemoved, Hashes: make([]uint64, 15), Medium: strings.Repeat("c", 32)},
		{Kind: BlockRemoved, Hashes: make([]uint64, 16)},
	}, DataParallelRank: -7, HasRank: true}
	want := strings.Join([]string{
		"93 cb3fb999999999999a 93",
		"98 ab426c6f636b53746f726564",
		"9a 00 7f cc80 ccff cd0100 cdffff ce00010000 ceffffffff cf0000000100000000 cfffffffffffffffff", // hashes
		"cf8000000000000005", // parent
		"9f 7f cc80 ccff cd0100 cdffff ce00010000 ce7fffffff ff e0 d0df d080 d1ff7f d18000 d2ffff7fff d280000000", // tokens
		"ce00010000 c0 bf" + strings.Repeat("6d", 31) + "c0",
		"93 ac426c6f636b52656d6f766564 9f" + strings.Repeat("00", 15) + "d920" + strings.Repeat("63", 32),
		"93 ac426c6f636b52656d6f766564 dc0010" + strings.Repeat("00", 16) + "c0",
		"f9", // data_parallel_rank -7
	}, "")
	if got, want := hex.EncodeToString(AppendBatch(nil, &small, EncodingArray)), strings.ReplaceAll(want, " ", ""); got != want {
		t.Errorf("small batch: encoding changed\n got %s\nwant %s", got, want)
	}

	large := Batch{TS: 1e300, Events: []Event{
		{Kind: BlockStored, Hashes: make([]uint64, 65536), Tokens: make([]int32, 65535), BlockSize: 1, Medium: strings.Repeat("x", 255)},
		{Kind: BlockRemoved, Hashes: []uint64{1}, Medium: strings.Repeat("y", 256)},
		{Kind: BlockRemoved, Hashes: []uint64{1}, Medium: strings.Repeat("z", 65535)},
		{Kind: BlockRemoved, Hashes: []uint64{1}, Medium: strings.Repeat("w", 65536)},
	}, DataParallelRank: 1 << 40, HasRank: true}
	enc := AppendBatch(nil, &large, EncodingArray)
	if got, want := fmt.Sprintf("%d %x", len(enc), sha256.Sum256(enc)), "262759 e6ed311766ce6a6ab714e50867debbe969bb8e8d08c4ed5ad919694ec25e18ba"; got != want {
		t.Errorf("large batch: encoding changed: %s, want %s", got, want)
	}
}
