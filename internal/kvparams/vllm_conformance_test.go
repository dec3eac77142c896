package kvparams

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// The conformance suite against vLLM's recorded kv_transfer_params
// (testdata/vllm/<version>/kvparams, written by scripts/vllm/record.sh from
// vLLM's NIXL connector's own request_finished; see docs/usage/vllm.md).

const vllmTestdata = "../../testdata/vllm"

// recordedFinish is one call of the connector's request_finished: the
// params the request carried in, and what it returned.
type recordedFinish struct {
	Request  json.RawMessage `json:"request_kv_transfer_params"`
	Returned json.RawMessage `json:"kv_transfer_params"`
}

func recordedParams(t *testing.T) map[string]recordedFinish {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(vllmTestdata, "*", "kvparams", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no recorded kv_transfer_params under %s (%v): they are committed; re-create them with bash scripts/vllm/record.sh", vllmTestdata, err)
	}
	out := map[string]recordedFinish{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var r recordedFinish
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		rel, _ := filepath.Rel(vllmTestdata, f)
		out[rel] = r
	}
	return out
}

// TestVLLMRecordedParamsParse parses every kv_transfer_params object vLLM's
// connector took or returned, and checks that marshalling the result gives
// back every field vLLM set, with its value: params pass through Tandem (its
// proxy, its engines' connector) unchanged.
func TestVLLMRecordedParamsParse(t *testing.T) {
	for name, r := range recordedParams(t) {
		for leg, raw := range map[string]json.RawMessage{"request": r.Request, "returned": r.Returned} {
			if string(raw) == "null" || len(raw) == 0 {
				continue
			}
			t.Run(name+"/"+leg, func(t *testing.T) {
				p, err := Parse(raw)
				if err != nil {
					t.Fatalf("Tandem refuses vLLM's params: %v\n%s", err, raw)
				}
				out, err := json.Marshal(p)
				if err != nil {
					t.Fatal(err)
				}
				var want, got map[string]any
				json.Unmarshal(raw, &want)
				json.Unmarshal(out, &got)
				for k, v := range want {
					if v == nil {
						continue // absent and null read the same to vLLM (params.get)
					}
					if !reflect.DeepEqual(got[k], v) {
						t.Errorf("%s: %v after a round trip through Tandem, vLLM set %v", k, got[k], v)
					}
				}
			})
		}
	}
}

// TestVLLMPrefillFinishedFields checks the typed view of the params a vLLM
// prefill returns: each field the decode leg needs lands in its field.
func TestVLLMPrefillFinishedFields(t *testing.T) {
	found := false
	for name, r := range recordedParams(t) {
		if filepath.Base(name) != "prefill-finished.json" {
			continue
		}
		found = true
		p, err := Parse(r.Returned)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		json.Unmarshal(r.Returned, &m)
		if !p.DoRemotePrefill || p.DoRemoteDecode {
			t.Errorf("%s: do_remote_prefill %v do_remote_decode %v, want true and false", name, p.DoRemotePrefill, p.DoRemoteDecode)
		}
		if p.RemoteEngineID != m["remote_engine_id"] || p.RemoteHost != m["remote_host"] ||
			float64(p.RemotePort) != m["remote_port"] || p.RemoteRequestID != m["remote_request_id"] ||
			float64(p.TPSize) != m["tp_size"] || float64(p.RemoteNumTokens) != m["remote_num_tokens"] ||
			p.TransferMode != m["transfer_mode"] {
			t.Errorf("%s: typed %+v, recorded %v", name, p, m)
		}
		if len(p.RemoteBlockIDs) != 1 || len(p.RemoteBlockIDs[0]) == 0 {
			t.Errorf("%s: remote_block_ids %v: want one group of blocks", name, p.RemoteBlockIDs)
		}
	}
	if !found {
		t.Fatal("no recorded prefill-finished.json: run bash scripts/vllm/record.sh")
	}
}

// TestTandemPrefillLegMatchesVLLM checks what Tandem's proxy sends a prefill
// engine (Params{DoRemoteDecode: true}, marshalled) against the request
// params vLLM's connector was recorded taking: the same object.
func TestTandemPrefillLegMatchesVLLM(t *testing.T) {
	out, err := json.Marshal(Params{DoRemoteDecode: true})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	json.Unmarshal(out, &got)
	for name, r := range recordedParams(t) {
		if filepath.Base(name) != "prefill-finished.json" {
			continue
		}
		var want map[string]any
		json.Unmarshal(r.Request, &want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Tandem's prefill leg sends %s, vLLM's proxy %s", name, out, r.Request)
		}
	}
}

// TestVLLMBidirectionalExpiryIsNotUnixTime checks how the two clocks of
// remote_blocks_expiry_time are told apart: vLLM's recorded bidirectional
// decode answer carries a perf_counter deadline, which UnixExpiry does not
// take for a Unix time; a Tandem decode's Unix seconds it does.
func TestVLLMBidirectionalExpiryIsNotUnixTime(t *testing.T) {
	rec, ok := recordedParams(t)["0.32.0/kvparams/decode-bidirectional.json"]
	if !ok {
		t.Fatal("no recorded decode-bidirectional.json for vLLM 0.32.0")
	}
	p, err := Parse(rec.Returned)
	if err != nil {
		t.Fatal(err)
	}
	if p.RemoteBlocksExpiryTime <= 0 || p.RemoteBlocksExpiryTime >= MinUnixExpiry {
		t.Fatalf("vLLM's recorded expiry %v is not a perf_counter deadline: re-read vLLM's NIXL connector (request_finished) and MinUnixExpiry's comment", p.RemoteBlocksExpiryTime)
	}
	if at, ok := p.UnixExpiry(); ok {
		t.Errorf("vLLM's perf_counter deadline %v read as Unix time %v", p.RemoteBlocksExpiryTime, at)
	}
	tandem := Params{RemoteBlocksExpiryTime: 1_800_000_010.25}
	if at, ok := tandem.UnixExpiry(); !ok || !at.Equal(time.Unix(1_800_000_010, 250_000_000)) {
		t.Errorf("Tandem's Unix expiry read as %v, %v", at, ok)
	}
	if _, ok := (&Params{}).UnixExpiry(); ok {
		t.Error("no expiry read as a time")
	}
	if at, ok := (&Params{RemoteBlocksExpiryTime: 1e300}).UnixExpiry(); !ok || at.Year() < 2200 {
		t.Errorf("a far expiry read as %v, %v", at, ok)
	}
}
