package kvparams

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// full has every field set.
func full() Params {
	return Params{
		DoRemoteDecode: true, DoRemotePrefill: true, RemoteEngineID: "e", RemoteBlockIDs: [][]int{{3, 4}},
		RemoteHost: "h", RemotePort: 5600, RemoteRequestID: "r", RemoteNumTokens: 20, TPSize: 1, DCPSize: 1, PPSize: 1,
		TransferMode: "pull", RemoteRegistrationGeneration: 7, RemoteBlocksExpiryTime: 1.5e9, History: []string{"00ff"},
		PromptDigest: "d", Signature: "v1.1.x", Extra: map[string]json.RawMessage{"vendor_field": json.RawMessage(`{"a":[1,2]}`)},
	}
}

func TestEveryTaggedFieldIsParsedAndWritten(t *testing.T) {
	var tags []string
	ty := reflect.TypeFor[Params]()
	for field := range ty.Fields() {
		name, _, _ := strings.Cut(field.Tag.Get("json"), ",")
		if name != "-" {
			tags = append(tags, name)
		}
	}
	var parsed []string
	for k := range setters {
		parsed = append(parsed, k)
	}
	var written map[string]json.RawMessage
	if err := json.Unmarshal(full().Raw(), &written); err != nil {
		t.Fatal(err)
	}
	delete(written, "vendor_field")
	var keys []string
	for k := range written {
		keys = append(keys, k)
	}
	slices.Sort(tags)
	slices.Sort(parsed)
	slices.Sort(keys)
	if !slices.Equal(tags, parsed) || !slices.Equal(tags, keys) {
		t.Errorf("keys differ:\n tags    %v\n parsed  %v\n written %v", tags, parsed, keys)
	}
}

func TestRoundTrip(t *testing.T) {
	want := full()
	got, err := Parse(want.Raw())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse(Marshal(p)) = %+v, want %+v", got, want)
	}
}

func TestThePrefillLegsParamsAreVLLMsProxyShape(t *testing.T) {
	const vllm = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`
	if got := string(Params{DoRemoteDecode: true}.Raw()); got != vllm {
		t.Errorf("got  %s\nwant %s", got, vllm)
	}
}

func TestUnknownKeysPassThroughVerbatim(t *testing.T) {
	p, err := Parse([]byte(`{"do_remote_prefill":true,"x_vendor":{"k":[1,"two",null]},"remote_engine_id":null,"y":1.50}`))
	if err != nil {
		t.Fatal(err)
	}
	if !p.DoRemotePrefill || p.RemoteEngineID != "" {
		t.Errorf("parsed %+v", p)
	}
	out := string(p.Raw())
	for _, want := range []string{`"x_vendor":{"k":[1,"two",null]}`, `"y":1.50`} {
		if !strings.Contains(out, want) {
			t.Errorf("%s does not keep %s", out, want)
		}
	}
}

func TestNumbersMayBeIntegralFloats(t *testing.T) {
	p, err := Parse([]byte(`{"remote_port":5600.0,"remote_block_ids":[1,2.0],"remote_num_tokens":1e1}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.RemotePort != 5600 || !reflect.DeepEqual(p.RemoteBlockIDs, [][]int{{1, 2}}) || p.RemoteNumTokens != 10 {
		t.Errorf("parsed %+v", p)
	}
}

func TestMalformedFieldsAreNamed(t *testing.T) {
	cases := []struct{ name, in, field, want string }{
		{"not an object", `[1]`, "", "must be a JSON object"},
		{"null is not an object", `null`, "", "must be a JSON object"},
		{"a string flag", `{"do_remote_prefill":"yes"}`, "do_remote_prefill", `do_remote_prefill must be true or false, got "yes"`},
		{"a numeric request id", `{"remote_request_id":5}`, "remote_request_id", "remote_request_id must be a non-empty string, got 5"},
		{"an empty engine id", `{"remote_engine_id":""}`, "remote_engine_id", "must be a non-empty string"},
		{"a port out of range", `{"remote_port":70000}`, "remote_port", "remote_port must be a TCP port (1-65535), got 70000"},
		{"a fractional port", `{"remote_port":80.5}`, "remote_port", "remote_port must be a TCP port"},
		{"block ids as a string", `{"remote_block_ids":"0,1"}`, "remote_block_ids", "remote_block_ids must be a list"},
		{"a negative block id", `{"remote_block_ids":[[-1,2]]}`, "remote_block_ids", "remote_block_ids[0][0]"},
		{"a group that is not a list", `{"remote_block_ids":[[1],2]}`, "remote_block_ids", "remote_block_ids[1] must be a list"},
		{"a zero token count", `{"remote_num_tokens":0}`, "remote_num_tokens", "remote_num_tokens must be a positive integer"},
		{"a numeric generation", `{"remote_registration_generation":3}`, "remote_registration_generation", "decimal string"},
		{"a string expiry", `{"remote_blocks_expiry_time":"soon"}`, "remote_blocks_expiry_time", "a time in seconds"},
		{"history not a list", `{"tandem_history":"ab"}`, "tandem_history", "list of block hashes"},
		{"a long signature", `{"tandem_signature":"` + strings.Repeat("x", 300) + `"}`, "tandem_signature", "signature string"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in))
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Message, tc.want) {
				t.Errorf("Parse(%s) = %v, want a FieldError on %q saying %q", tc.in, err, tc.field, tc.want)
			}
		})
	}
}

func TestUnmarshalJSON(t *testing.T) {
	var v struct {
		KV Params `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal([]byte(`{"kv_transfer_params":{"do_remote_decode":true,"remote_port":1}}`), &v); err != nil {
		t.Fatal(err)
	}
	if !v.KV.DoRemoteDecode || v.KV.RemotePort != 1 {
		t.Errorf("got %+v", v.KV)
	}
	if err := json.Unmarshal([]byte(`{"kv_transfer_params":{"remote_port":0}}`), &v); err == nil {
		t.Error("port 0 accepted")
	}
}

func TestPromptDigestBindsEveryTokenAndTheModel(t *testing.T) {
	prompt := make([]int32, 5000) // more than one hashing chunk
	for i := range prompt {
		prompt[i] = int32(i % 512)
	}
	base := PromptDigest("m", prompt)
	if len(base) != 64 || base != PromptDigest("m", slices.Clone(prompt)) {
		t.Fatalf("digest %q is not a stable 64-digit hex string", base)
	}
	for _, i := range []int{0, 4095, 4096, 4999} {
		other := slices.Clone(prompt)
		other[i]++
		if PromptDigest("m", other) == base {
			t.Errorf("changing token %d keeps the digest", i)
		}
	}
	if PromptDigest("m2", prompt) == base || PromptDigest("m", prompt[:4999]) == base {
		t.Error("another model or a shorter prompt has the same digest")
	}
}
