package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// object is a JSON object kept as its keys in order and each value's raw
// bytes, so that a request body can be edited field by field and written
// back with every field the proxy does not touch byte-for-byte as the client
// sent it (numbers keep their spelling, unknown fields and their order
// survive). A repeated key keeps its first position and its last value, as
// encoding/json and Python's json module do.
type object struct {
	keys []string
	vals map[string]json.RawMessage
}

// parseObject parses b, which must be exactly one JSON object.
func parseObject(b []byte) (*object, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("body is not valid JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("body must be a JSON object")
	}
	o := &object{vals: make(map[string]json.RawMessage)}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("body is not valid JSON: %w", err)
		}
		key, ok := tok.(string)
		if !ok {
			return nil, errors.New("body is not valid JSON: object key is not a string")
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("body is not valid JSON: field %q: %w", key, err)
		}
		o.set(key, raw)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fmt.Errorf("body is not valid JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("body is not valid JSON: data after the object")
	}
	return o, nil
}

// get returns the raw value of key, or nil when it is absent.
func (o *object) get(key string) json.RawMessage { return o.vals[key] }

// set replaces key's value in place, or appends key when it is absent.
func (o *object) set(key string, raw json.RawMessage) {
	if _, ok := o.vals[key]; !ok {
		o.keys = append(o.keys, key)
	}
	o.vals[key] = raw
}

// getFolded returns the value the engines' encoding/json would read for
// key: that of the last key equal to it under case folding, or nil.
func (o *object) getFolded(key string) json.RawMessage {
	var v json.RawMessage
	for _, k := range o.keys {
		if strings.EqualFold(k, key) {
			v = o.vals[k]
		}
	}
	return v
}

// hasFolded reports whether a key equal to key under case folding is
// present.
func (o *object) hasFolded(key string) bool {
	for _, k := range o.keys {
		if strings.EqualFold(k, key) {
			return true
		}
	}
	return false
}

// setFolded sets key to raw in place of the first key equal to it under
// case folding and drops every other such key; a nil raw drops them all. The
// engines decode bodies with encoding/json, which matches field names
// case-insensitively (strings.EqualFold's folding) and lets the last match
// win: an edit that set "stream" but left a client's "STREAM" in place, or
// replaced "kv_transfer_params" but kept "Kv_Transfer_Params", would not be
// the edit the engine sees.
func (o *object) setFolded(key string, raw json.RawMessage) {
	placed := false
	keys := o.keys[:0:0]
	for _, k := range o.keys {
		if !strings.EqualFold(k, key) {
			keys = append(keys, k)
			continue
		}
		delete(o.vals, k)
		if raw != nil && !placed {
			keys = append(keys, key)
			placed = true
		}
	}
	o.keys = keys
	if raw != nil {
		if !placed {
			o.keys = append(o.keys, key)
		}
		o.vals[key] = raw
	}
}

// clone returns a copy that can be edited without changing o. Raw values are
// shared; they are never modified in place.
func (o *object) clone() *object {
	c := &object{keys: append([]string(nil), o.keys...), vals: make(map[string]json.RawMessage, len(o.vals))}
	for k, v := range o.vals {
		c.vals[k] = v
	}
	return c
}

// marshal writes the object with its keys in order and values verbatim.
func (o *object) marshal() []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k) // a string never fails to marshal
		b.Write(kb)
		b.WriteByte(':')
		b.Write(o.vals[k])
	}
	b.WriteByte('}')
	return b.Bytes()
}

// prefillKVParams asks the prefill engine to keep the prompt's KV for a
// remote decode. The null placeholders match vLLM's toy proxy so that engines
// which validate the shape accept it.
var prefillKVParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// kvParamsKey is the body field that carries P/D state between engines.
// The proxy writes it on both legs and never forwards a client's.
const kvParamsKey = "kv_transfer_params"

// prefillBody turns the client's request into the prefill leg's: one token,
// one sample, no streaming, no minimum lengths, and kv (prefillKVParams, or
// in conversation mode a decode's params naming the history's KV) asking P
// to hold the KV for a remote decode (vllm-pd.md §1.2, §1.5), replacing
// whatever kv_transfer_params the client sent.
//
// n is set to 1 only when the client sent it: 1 is every engine's default
// (OpenAI's, vLLM's, Tandem's), so an absent n already asks for one sample
// and the leg stays as close to the client's body as it can. best_of goes:
// it asks for more samples than n.
func prefillBody(client *object, kv json.RawMessage) []byte {
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

// decodeBody is the client's request with kv_transfer_params set to what the
// prefill engine returned, verbatim (vllm-pd.md §1.4), replacing whatever
// the client sent.
func decodeBody(client *object, kv json.RawMessage) []byte {
	o := client.clone()
	o.setFolded(kvParamsKey, kv)
	return o.marshal()
}

// fallbackBody is the decode leg's body when the prefill leg failed: the
// client's bytes untouched, or, when the client sent kv_transfer_params, its
// fields without them. Client-written params would make the decode engine
// dial wherever they point.
func fallbackBody(raw []byte, client *object) []byte {
	if !client.hasFolded(kvParamsKey) {
		return raw
	}
	o := client.clone()
	o.setFolded(kvParamsKey, nil)
	return o.marshal()
}

// withoutConversationID returns the client's request without its
// conversation_id field (any letter case), which is the proxy's and which an
// engine that refuses unknown fields would reject, and the bytes to send on
// a fallback leg: raw itself when there was no such field.
func withoutConversationID(raw []byte, client *object) (*object, []byte) {
	if !client.hasFolded(conversationIDKey) {
		return client, raw
	}
	o := client.clone()
	o.setFolded(conversationIDKey, nil)
	return o, o.marshal()
}

// kvParamsFrom returns the kv_transfer_params object of a prefill response,
// or nil when the response has none (absent, null, or not an object), which
// means the prefill engine did not keep the KV for us.
func kvParamsFrom(resp []byte) (json.RawMessage, error) {
	o, err := parseObject(resp)
	if err != nil {
		return nil, err
	}
	kv := bytes.TrimSpace(o.get("kv_transfer_params"))
	if len(kv) == 0 || kv[0] != '{' {
		return nil, nil
	}
	return kv, nil
}
