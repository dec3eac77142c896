package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestObjectRoundTrip(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"keys keep their order and values their bytes", `{"b": 1.50, "a" :[ 1 ,2 ],"c":{"x" : null}}`, `{"b":1.50,"a":[ 1 ,2 ],"c":{"x" : null}}`},
		{"a repeated key keeps its first place and last value", `{"a":1,"b":2,"a":3}`, `{"a":3,"b":2}`},
		{"an empty object", ` {} `, `{}`},
		{"escaped keys are re-encoded equivalently", `{"\u0061b":"\u00e9"}`, `{"ab":"\u00e9"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseObject([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if got := string(o.marshal()); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

func TestParseObjectRejects(t *testing.T) {
	for _, in := range []string{``, `null`, `[]`, `"x"`, `{"a":}`, `{"a":1`, `{"a":1}x`, `{"a":1}{}`, `{1:2}`} {
		if _, err := parseObject([]byte(in)); err == nil {
			t.Errorf("parseObject(%q) succeeded, want an error", in)
		}
	}
}

func TestKVParamsFrom(t *testing.T) {
	tests := []struct {
		name, resp, want string
	}{
		{"an object is returned verbatim", `{"id":"x","kv_transfer_params":{"a": [1, 2]}}`, `{"a": [1, 2]}`},
		{"absent", `{"id":"x"}`, ""},
		{"null", `{"kv_transfer_params":null}`, ""},
		{"not an object", `{"kv_transfer_params":"yes"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := kvParamsFrom([]byte(tt.resp))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// FuzzParseObject checks that any body the parser accepts round-trips to
// JSON that parses again to the same keys and values.
func FuzzParseObject(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `{"a":{"b":[1,"x",null]},"a":2}`, `{"prompt":"` + strings.Repeat("x", 10) + `"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := parseObject(b)
		if err != nil {
			return
		}
		again, err := parseObject(o.marshal())
		if err != nil {
			t.Fatalf("re-parsing %q: %v", o.marshal(), err)
		}
		if string(again.marshal()) != string(o.marshal()) {
			t.Fatalf("not stable: %q then %q", o.marshal(), again.marshal())
		}
	})
}

// parseObjectDecoder is parseObject as first written, with json.Decoder's
// tokens: the reference the fast parser must agree with.
func parseObjectDecoder(b []byte) (*object, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not an object")
	}
	o := &object{vals: make(map[string]json.RawMessage)}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, errors.New("key is not a string")
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, err
		}
		o.set(key, raw)
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the object")
	}
	return o, nil
}

// FuzzParseObjectMatchesDecoder checks the fast parser against
// json.Decoder: both accept the same bodies and read the same keys, in the
// same order, with the same raw values.
func FuzzParseObjectMatchesDecoder(f *testing.F) {
	for _, s := range []string{`{}`, ` { } `, `{"a":1}`, `{"a" : [ 1 , {"b":"}"} ] , "a\"b":"\\"}`, `{"\u0061":1,"a":2}`,
		`{"é":"x"}`, "{\"\xff\":1}", `{"a":1}x`, `{"a":tru}`, `{"a":-0.5e+3,"b":false,"c":null}`, `[1]`, `{"a":{"b":[1,"x",null]},"a":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, gerr := parseObject(b)
		want, werr := parseObjectDecoder(b)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("%q: fast parser err %v, decoder err %v", b, gerr, werr)
		}
		if gerr != nil {
			return
		}
		if !slices.Equal(got.keys, want.keys) {
			t.Fatalf("%q: keys %q, want %q", b, got.keys, want.keys)
		}
		for _, k := range want.keys {
			if !bytes.Equal(got.vals[k], want.vals[k]) {
				t.Fatalf("%q: %q = %q, want %q", b, k, got.vals[k], want.vals[k])
			}
		}
		if !bytes.Equal(got.marshal(), want.marshal()) {
			t.Fatalf("%q: marshal %q, want %q", b, got.marshal(), want.marshal())
		}
	})
}

// prefillBodySetFolded is prefillBody as first written, edit by edit on a
// clone: the reference marshalEdited must agree with.
func prefillBodySetFolded(client *object, kv json.RawMessage) []byte {
	o := client.clone()
	o.setFolded("stream", json.RawMessage(`false`))
	o.setFolded("max_tokens", json.RawMessage(`1`))
	if o.hasFolded("max_completion_tokens") {
		o.setFolded("max_completion_tokens", json.RawMessage(`1`))
	}
	if o.hasFolded("n") {
		o.setFolded("n", json.RawMessage(`1`))
	}
	o.setFolded("best_of", nil)
	o.setFolded("stream_options", nil)
	o.setFolded("min_tokens", nil)
	o.setFolded("min_completion_tokens", nil)
	o.setFolded(kvParamsKey, kv)
	return o.marshal()
}

// FuzzLegBodiesMatchSetFolded checks the one-pass leg bodies against the
// field-by-field edits, and that kvParamsFrom reads what parseObject does.
func FuzzLegBodiesMatchSetFolded(f *testing.F) {
	for _, s := range []string{`{}`, `{"prompt":"x","STREAM":true,"stream":false,"N":2,"best_of":3}`,
		`{"Kv_Transfer_Params":{"a":1},"max_completion_tokens":5,"Max_Tokens":7}`, `{"min_tokens":1,"stream_options":{},"n":1}`,
		`{"kv_transfer_params":{"x":1},"kv_transfer_params":null}`, `{"kv_transfer_params":{"x":1},"kv\u005ftransfer_params":{"y":2}}`} {
		f.Add([]byte(s))
	}
	kv := json.RawMessage(`{"do_remote_decode":true}`)
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := parseObject(b)
		if err != nil {
			return
		}
		if got, want := prefillBody(o, kv), prefillBodySetFolded(o, kv); !bytes.Equal(got, want) {
			t.Fatalf("%q: prefill body %q, want %q", b, got, want)
		}
		c := o.clone()
		c.setFolded(kvParamsKey, kv)
		if got, want := decodeBody(o, kv), c.marshal(); !bytes.Equal(got, want) {
			t.Fatalf("%q: decode body %q, want %q", b, got, want)
		}
		c = o.clone()
		c.setFolded(kvParamsKey, nil)
		if got, want := fallbackBody(b, o), c.marshal(); o.hasFolded(kvParamsKey) && !bytes.Equal(got, want) {
			t.Fatalf("%q: fallback body %q, want %q", b, got, want)
		}
		got, err := kvParamsFrom(b)
		if err != nil {
			t.Fatal(err)
		}
		want := bytes.TrimSpace(o.get(kvParamsKey))
		if len(want) == 0 || want[0] != '{' {
			want = nil
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%q: kv params %q, want %q", b, got, want)
		}
	})
}
