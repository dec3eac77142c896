package proxy

import (
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
