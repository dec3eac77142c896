package kvparams

import (
	"bytes"
	"reflect"
	"testing"
)

// FuzzParse: Parse never panics, and what it accepts marshals to params
// it parses back to the same value, whose marshalling is stable.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`,
		string(full().Raw()),
		`{"remote_block_ids":[1,2,3],"remote_port":5600.0,"x":{"y":[null]}}`,
		`{"remote_block_ids":[[1],[2,3]],"tandem_history":["a","b"],"remote_blocks_expiry_time":1e9}`,
		`{}`, `null`, `[]`, `{"a":1,"a":2}`,
		string(typical().Raw()),
		`{"remote_block_ids":[ [ 1 , 2 ] , [] ],"remote_port":"5600","tandem_history":[],"tp_size":0}`,
		`{"remote_block_ids":[1,[2]],"remote_host":"h\u00e9","tandem_signature":"","remote_num_tokens":2147483648}`,
		`{"remote_engine_id":"a<b&c>","tandem_history":["\u00e9","x"],"remote_host":"caf\u00e9"}`,
		`{"remote_block_ids":[],"tandem_history":["a\"b"],"remote_registration_generation":"18446744073709551616"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		general, gerr := parse(data, false)
		if (err == nil) != (gerr == nil) {
			t.Fatalf("fast and general paths disagree on %q: %v / %v", data, err, gerr)
		}
		if err != nil {
			return
		}
		if !reflect.DeepEqual(p, general) {
			t.Fatalf("fast and general paths disagree on %q:\n%+v\n%+v", data, p, general)
		}
		once, err := p.MarshalJSON()
		if err != nil {
			t.Fatalf("Marshal of parsed %q: %v", data, err)
		}
		if ref, err := p.marshal(false); err != nil || !bytes.Equal(once, ref) {
			t.Fatalf("fast and general marshalling disagree on %q:\n%s\n%s (%v)", data, once, ref, err)
		}
		q, err := Parse(once)
		if err != nil {
			t.Fatalf("Parse(Marshal(Parse(%q))) = %v; marshalled %s", data, err, once)
		}
		twice := q.Raw()
		if !bytes.Equal(once, twice) {
			t.Fatalf("marshalling is not stable:\n%s\n%s", once, twice)
		}
		p.Extra, q.Extra = nil, nil // compared as bytes above (Marshal compacts them)
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("round trip of %q:\n%+v\n%+v", data, p, q)
		}
	})
}
