package kvevents

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The conformance suite against vLLM's recorded wire (testdata/vllm, written
// by scripts/vllm/record.sh; see docs/usage/vllm.md). It needs no vLLM: the
// payloads were recorded from vLLM's own code and, where a file says
// "recorded" in its version's manifest.json, from a running vllm serve.

var updateTandemFixtures = flag.Bool("update-vllm-fixtures", false, "rewrite testdata/vllm/tandem/*.msgpack from Tandem's encoder (then re-run scripts/vllm/record.sh so vLLM judges them)")

const vllmTestdata = "../../testdata/vllm"

// vllmVersions are the recorded versions: every directory of testdata/vllm
// but tandem (Tandem's own payloads).
func vllmVersions(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(vllmTestdata)
	if err != nil {
		t.Fatalf("reading the recorded vLLM payloads: %v (they are committed; re-create them with bash scripts/vllm/record.sh)", err)
	}
	var vs []string
	for _, e := range ents {
		if e.IsDir() && e.Name() != "tandem" {
			vs = append(vs, e.Name())
		}
	}
	if len(vs) == 0 {
		t.Fatal("no recorded vLLM version under testdata/vllm: run bash scripts/vllm/record.sh")
	}
	return vs
}

// recordedEvent is an event as vLLM's decoder read it (the .json beside each
// .msgpack). Hashes are integers or, for byte hashes, hex strings.
type recordedEvent struct {
	Type        string        `json:"type"`
	BlockHashes []json.Number `json:"block_hashes"`
	Parent      *json.Number  `json:"parent_block_hash"`
	TokenIDs    []int32       `json:"token_ids"`
	BlockSize   int           `json:"block_size"`
	Medium      *string       `json:"medium"`
	// GroupIdx and Window are group_idx and kv_cache_spec_sliding_window
	// (nil: None).
	GroupIdx, Window *int
}

type recordedBatch struct {
	TS     float64         `json:"ts"`
	Rank   *int            `json:"data_parallel_rank"`
	Events []recordedEvent `json:"events"`
}

// wireHash turns a recorded hash into what DecodeBatch yields: the integer,
// or a byte hash's last 8 bytes, big-endian.
func wireHash(t *testing.T, n json.Number) uint64 {
	t.Helper()
	s := string(n)
	if strings.HasPrefix(s, `"`) || !strings.ContainsAny(s[:1], "0123456789-") {
		s = strings.Trim(s, `"`)
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatalf("hash %q: %v", s, err)
		}
		var v uint64
		for _, c := range b[max(0, len(b)-8):] {
			v = v<<8 | uint64(c)
		}
		return v
	}
	if v, err := strconv.ParseUint(s, 10, 64); err == nil {
		return v
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("hash %s: %v", s, err)
	}
	return uint64(v)
}

// readRecorded reads a .json expectation; hex-string hashes are kept as
// json.Number by quoting them first.
func readRecorded(t *testing.T, path string) recordedBatch {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var generic struct {
		TS     float64          `json:"ts"`
		Rank   *int             `json:"data_parallel_rank"`
		Events []map[string]any `json:"events"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&generic); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out := recordedBatch{TS: generic.TS, Rank: generic.Rank}
	num := func(v any) json.Number {
		switch v := v.(type) {
		case json.Number:
			return v
		case string:
			return json.Number(`"` + v + `"`)
		}
		t.Fatalf("%s: hash %v of type %T", path, v, v)
		return ""
	}
	for _, m := range generic.Events {
		e := recordedEvent{Type: m["type"].(string)}
		if hs, ok := m["block_hashes"].([]any); ok {
			for _, h := range hs {
				e.BlockHashes = append(e.BlockHashes, num(h))
			}
		}
		if p, ok := m["parent_block_hash"]; ok && p != nil {
			n := num(p)
			e.Parent = &n
		}
		if ts, ok := m["token_ids"].([]any); ok {
			for _, x := range ts {
				v, _ := x.(json.Number).Int64()
				e.TokenIDs = append(e.TokenIDs, int32(v))
			}
		}
		if bs, ok := m["block_size"].(json.Number); ok {
			v, _ := bs.Int64()
			e.BlockSize = int(v)
		}
		if md, ok := m["medium"].(string); ok {
			e.Medium = &md
		}
		for key, dst := range map[string]**int{"group_idx": &e.GroupIdx, "kv_cache_spec_sliding_window": &e.Window} {
			if v, ok := m[key].(json.Number); ok {
				n, _ := v.Int64()
				*dst = new(int(n))
			}
		}
		out.Events = append(out.Events, e)
	}
	return out
}

// TestVLLMRecordedBatchesDecode decodes every KV-event batch recorded from
// vLLM (its msgspec types in both encodings, and the batches a running vllm
// serve published) and checks each field Tandem reads against what vLLM's
// own decoder read from the same bytes.
func TestVLLMRecordedBatchesDecode(t *testing.T) {
	for _, v := range vllmVersions(t) {
		files, _ := filepath.Glob(filepath.Join(vllmTestdata, v, "kvevents", "*.msgpack"))
		if len(files) == 0 {
			t.Errorf("vLLM %s: no recorded KV-event batch", v)
		}
		live := 0
		for _, f := range files {
			name := v + "/" + filepath.Base(f)
			if strings.HasPrefix(filepath.Base(f), "live-") {
				live++
			}
			t.Run(name, func(t *testing.T) {
				payload, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				got, err := DecodeBatch(payload)
				if err != nil {
					t.Fatalf("Tandem cannot decode what vLLM %s sends: %v", v, err)
				}
				want := readRecorded(t, strings.TrimSuffix(f, ".msgpack")+".json")
				checkRecorded(t, got, want)
			})
		}
		t.Logf("vLLM %s: %d batches, %d of them from a running engine", v, len(files), live)
	}
}

func checkRecorded(t *testing.T, got *Batch, want recordedBatch) {
	t.Helper()
	if got.TS != want.TS {
		t.Errorf("ts %v, want %v", got.TS, want.TS)
	}
	if want.Rank == nil && got.HasRank || want.Rank != nil && (!got.HasRank || got.DataParallelRank != *want.Rank) {
		t.Errorf("rank %d (set %v), want %v", got.DataParallelRank, got.HasRank, want.Rank)
	}
	if len(got.Events) != len(want.Events) {
		t.Fatalf("%d events, want %d", len(got.Events), len(want.Events))
	}
	for i, w := range want.Events {
		g := got.Events[i]
		if g.Kind.String() != w.Type {
			t.Errorf("event %d: %s, want %s", i, g.Kind, w.Type)
			continue
		}
		var hs []uint64
		for _, h := range w.BlockHashes {
			hs = append(hs, wireHash(t, h))
		}
		if fmt.Sprint(g.Hashes) != fmt.Sprint(hs) {
			t.Errorf("event %d: hashes %v, want %v", i, g.Hashes, hs)
		}
		medium := ""
		if w.Medium != nil {
			medium = *w.Medium
		}
		if g.Medium != medium {
			t.Errorf("event %d: medium %q, want %q", i, g.Medium, medium)
		}
		if (w.GroupIdx != nil) != g.HasGroup || w.GroupIdx != nil && g.Group != *w.GroupIdx {
			t.Errorf("event %d: group %d (set %v), want %v", i, g.Group, g.HasGroup, w.GroupIdx)
		}
		if want := 0; w.Window != nil && g.Window != *w.Window || w.Window == nil && g.Window != want {
			t.Errorf("event %d: sliding window %d, want %v", i, g.Window, w.Window)
		}
		if g.Kind != BlockStored {
			continue
		}
		if (w.Parent != nil) != g.HasParent || w.Parent != nil && g.Parent != wireHash(t, *w.Parent) {
			t.Errorf("event %d: parent %d (set %v), want %v", i, g.Parent, g.HasParent, w.Parent)
		}
		if fmt.Sprint(g.Tokens) != fmt.Sprint(w.TokenIDs) || g.BlockSize != w.BlockSize {
			t.Errorf("event %d: tokens %v block size %d, want %v and %d", i, g.Tokens, g.BlockSize, w.TokenIDs, w.BlockSize)
		}
	}
}

// tandemBatches are the batches Tandem's encoder is checked with: the
// fields it publishes, in the shapes an engine emits.
var tandemBatches = map[string]Batch{
	"basic": {TS: 1700000000.5, HasRank: true, Events: []Event{
		{Kind: BlockStored, Hashes: []uint64{0x1234, 0xFEDCBA9876543210}, Tokens: []int32{1, 2, 3, 4, 5, 6, 7, 8}, BlockSize: 4, Medium: MediumGPU},
		{Kind: BlockStored, Hashes: []uint64{7}, Parent: 0xFEDCBA9876543210, HasParent: true, Tokens: []int32{1, 2, 3, 4}, BlockSize: 4, Medium: MediumGPU},
		{Kind: BlockRemoved, Hashes: []uint64{0x1234}, Medium: MediumGPU},
		{Kind: AllBlocksCleared},
	}},
	"no-rank": {TS: 1700000002, Events: []Event{
		{Kind: BlockStored, Hashes: []uint64{1}, Tokens: []int32{5, 6}, BlockSize: 2},
	}},
}

// TestMapFormEqualsVLLMsBytes checks Tandem's map-form events byte for byte
// against what vLLM's own encoder wrote for the same events
// (kvevents/map-<name>.msgpack, recorded from vLLM's msgspec types). The
// events array is compared: vLLM writes a None data_parallel_rank as a
// trailing nil where Tandem leaves it out (both decode to None), and the
// timestamp and rank before and after it are checked by value.
func TestMapFormEqualsVLLMsBytes(t *testing.T) {
	for _, v := range vllmVersions(t) {
		for name, b := range tandemBatches {
			t.Run(v+"/"+name, func(t *testing.T) {
				recorded, err := os.ReadFile(filepath.Join(vllmTestdata, v, "kvevents", "map-"+name+".msgpack"))
				if err != nil {
					t.Fatalf("%v: re-create the recording with bash scripts/vllm/record.sh", err)
				}
				ours := AppendBatch(nil, &b, EncodingMap)
				// [ts float64, [event...], rank]: a 1-byte array header, 9
				// bytes of ts, the events, a rank of one byte (0 or nil).
				theirEvents := recorded[10 : len(recorded)-1]
				ourEvents := ours[10:]
				if b.HasRank {
					ourEvents = ours[10 : len(ours)-1]
				}
				if !bytes.Equal(ourEvents, theirEvents) {
					t.Errorf("events differ from vLLM %s's\n got %x\nwant %x", v, ourEvents, theirEvents)
				}
				got, err := DecodeBatch(recorded)
				if err != nil {
					t.Fatal(err)
				}
				if got.TS != b.TS || got.HasRank != b.HasRank || got.DataParallelRank != b.DataParallelRank {
					t.Errorf("vLLM's batch has ts %v rank %d (set %v), Tandem's %v %d (%v)", got.TS, got.DataParallelRank, got.HasRank, b.TS, b.DataParallelRank, b.HasRank)
				}
			})
		}
	}
}

// tandemFixture is the file under testdata/vllm/tandem holding batch name
// in form enc: <name>.msgpack for the map form Tandem publishes by default,
// array-<name>.msgpack for the array form.
func tandemFixture(name string, enc Encoding) string {
	if enc == EncodingArray {
		name = "array-" + name
	}
	return filepath.Join(vllmTestdata, "tandem", name+".msgpack")
}

// knownRejected are the vLLM versions, and the event encodings, whose
// KVEventBatch decoder refuses Tandem's batches, with why, keyed
// "version/encoding". The test fails when a verdict differs from this list
// either way, so the list stays true.
var knownRejected = map[string]string{
	// vLLM dropped array_like from its event structs (events are msgpack maps
	// with a "type" key); its decoder refuses the positional events of
	// "event_encoding": "array". A consumer using vLLM's own types
	// (vllm.distributed.kv_events.KVEventBatch) takes only the map form, the
	// default; the array form is for consumers written for older vLLM.
	"0.32.0/array": "Expected `object`, got `array`",
}

// verdict is one decoder's judgement of a Tandem batch, from
// tandem-decoded.json.
type verdict struct {
	Accepted bool            `json:"accepted"`
	Error    string          `json:"error"`
	Decoded  json.RawMessage `json:"decoded"`
}

// TestTandemBatchesAgainstVLLM checks what Tandem publishes, in both event
// encodings, against vLLM's recorded schema. scripts/vllm/record.py ran two
// of vLLM's decoders over Tandem's bytes (testdata/vllm/tandem): its
// KVEventBatch as it is (events as maps), and its event types re-declared
// array_like (the form vLLM published before it switched to maps). The
// decoder of a batch's own form must accept it and read back exactly the
// fields Tandem encoded; vLLM's own decoder's verdict must be the one
// knownRejected expects.
func TestTandemBatchesAgainstVLLM(t *testing.T) {
	for _, enc := range []Encoding{EncodingMap, EncodingArray} {
		for name, b := range tandemBatches {
			checkTandemBatch(t, name, b, enc)
		}
	}
}

func checkTandemBatch(t *testing.T, name string, b Batch, enc Encoding) {
	t.Helper()
	payload := AppendBatch(nil, &b, enc)
	path := tandemFixture(name, enc)
	file := filepath.Base(path)
	if *updateTandemFixtures {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, payload, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fixed, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run go test ./internal/kvevents -run TestTandemBatchesAgainstVLLM -update-vllm-fixtures, then bash scripts/vllm/record.sh", err)
	}
	if !bytes.Equal(fixed, payload) {
		t.Fatalf("%s: Tandem's encoding changed since vLLM judged it: rerun with -update-vllm-fixtures, then bash scripts/vllm/record.sh", file)
	}
	sum := sha256.Sum256(payload)
	for _, v := range vllmVersions(t) {
		raw, err := os.ReadFile(filepath.Join(vllmTestdata, v, "tandem-decoded.json"))
		if err != nil {
			t.Errorf("vLLM %s: no verdict on Tandem's batches (%v): run bash scripts/vllm/record.sh", v, err)
			continue
		}
		var verdicts map[string]struct {
			SHA256    string  `json:"sha256"`
			VLLM      verdict `json:"vllm"`
			ArrayForm verdict `json:"array_form"`
		}
		if err := json.Unmarshal(raw, &verdicts); err != nil {
			t.Fatal(err)
		}
		vd, ok := verdicts[file]
		if !ok || vd.SHA256 != hex.EncodeToString(sum[:]) {
			t.Errorf("vLLM %s, %s: the recorded verdict is for other bytes: run bash scripts/vllm/record.sh", v, file)
			continue
		}
		own, ownName := vd.VLLM, "vLLM's KVEventBatch"
		if enc == EncodingArray {
			own, ownName = vd.ArrayForm, "vLLM's types in array form"
		}
		if !own.Accepted {
			t.Errorf("vLLM %s, %s: %s refuse Tandem's batch: %s", v, file, ownName, own.Error)
		} else {
			f := filepath.Join(t.TempDir(), "decoded.json")
			if err := os.WriteFile(f, own.Decoded, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Run(v+"/"+file+"/read-by-vllm", func(t *testing.T) { checkRecorded(t, &b, readRecorded(t, f)) })
		}
		key := v + "/" + enc.String()
		why, known := knownRejected[key]
		switch {
		case vd.VLLM.Accepted && known:
			t.Errorf("vLLM %s now accepts Tandem's %s: drop %s from knownRejected", v, file, key)
		case !vd.VLLM.Accepted && !known:
			t.Errorf("vLLM %s's decoder refuses Tandem's %s: %s", v, file, vd.VLLM.Error)
		case !vd.VLLM.Accepted && !strings.Contains(vd.VLLM.Error, why):
			t.Errorf("vLLM %s refuses Tandem's %s for another reason than known (%q): %s", v, file, why, vd.VLLM.Error)
		case !vd.VLLM.Accepted:
			t.Logf("vLLM %s's own decoder refuses Tandem's %s, as known: %s", v, file, vd.VLLM.Error)
		}
	}
}
