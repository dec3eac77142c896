package kvparams

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
)

// MarshalJSON implements json.Marshaler: vLLM's six fields first, always,
// null when zero (the shape vLLM's proxy sends a prefill), then the other
// fields that are set, in Params' order, then Extra's keys in sorted order.
// Keys in Extra that name a field of Params are not written: the field
// wins.
func (p Params) MarshalJSON() ([]byte, error) { return p.marshal(true) }

// marshal is MarshalJSON; with fast false every value goes through
// json.Marshal (the fuzz test checks both write the same bytes).
func (p Params) marshal(fast bool) ([]byte, error) {
	var b bytes.Buffer
	b.Grow(256 + 8*blockCount(p.RemoteBlockIDs))
	b.WriteByte('{')
	n := 0
	put := func(key string, v any) error {
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		if fast && plain(key) {
			b.Write(append(append(append(b.AvailableBuffer(), '"'), key...), '"', ':'))
		} else {
			name, _ := json.Marshal(key) // a string always marshals
			b.Write(name)
			b.WriteByte(':')
		}
		if fast {
			if enc := appendFast(b.AvailableBuffer(), v); enc != nil {
				b.Write(enc)
				return nil
			}
		}
		enc, err := json.Marshal(v)
		if err != nil {
			return err
		}
		b.Write(enc)
		return nil
	}
	orNull := func(set bool, v any) any {
		if !set {
			return nil
		}
		return v
	}
	fields := []struct {
		key string
		set bool
		v   any
	}{
		{"do_remote_decode", true, p.DoRemoteDecode},
		{"do_remote_prefill", true, p.DoRemotePrefill},
		{"remote_engine_id", true, orNull(p.RemoteEngineID != "", p.RemoteEngineID)},
		{"remote_block_ids", true, orNull(p.RemoteBlockIDs != nil, p.RemoteBlockIDs)},
		{"remote_host", true, orNull(p.RemoteHost != "", p.RemoteHost)},
		{"remote_port", true, orNull(p.RemotePort != 0, p.RemotePort)},
		{"remote_request_id", p.RemoteRequestID != "", p.RemoteRequestID},
		{"remote_num_tokens", p.RemoteNumTokens != 0, p.RemoteNumTokens},
		{"tp_size", p.TPSize != 0, p.TPSize},
		{"dcp_size", p.DCPSize != 0, p.DCPSize},
		{"pp_size", p.PPSize != 0, p.PPSize},
		{"transfer_mode", p.TransferMode != "", p.TransferMode},
		{"remote_registration_generation", p.RemoteRegistrationGeneration != 0, strconv.FormatUint(p.RemoteRegistrationGeneration, 10)},
		{"remote_blocks_expiry_time", p.RemoteBlocksExpiryTime != 0, p.RemoteBlocksExpiryTime},
		{"tandem_history", p.History != nil, p.History},
		{"tandem_prompt_digest", p.PromptDigest != "", p.PromptDigest},
		{"tandem_signature", p.Signature != "", p.Signature},
	}
	for _, f := range fields {
		if !f.set {
			continue
		}
		if err := put(f.key, f.v); err != nil {
			return nil, err
		}
	}
	keys := make([]string, 0, len(p.Extra))
	for k := range p.Extra {
		if _, known := setters[k]; !known {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		if err := put(k, p.Extra[k]); err != nil {
			return nil, err
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// Raw returns p marshalled, for a caller that passes params on as JSON
// bytes. Params always marshal (every field has a JSON form; Extra holds
// JSON a Parse produced), so it has no error to return; it panics on an
// Extra value that is not JSON.
func (p Params) Raw() json.RawMessage {
	b, err := p.MarshalJSON()
	if err != nil {
		panic("kvparams: " + err.Error())
	}
	return b
}
