package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tandem-serve/tandem/internal/kvparams"
)

// Body limits. The proxy edits a client's body before it sends it on (the
// prefill leg's fields, the kv_transfer_params on either leg), so a body the
// proxy accepts must still fit the engine's limit with the edits: the
// default client limit is the engines' default less MaxLegGrowth.
const (
	// engineMaxBodyBytes is the engines' default body limit
	// (openai.DefaultMaxBodyBytes; a test keeps the two equal).
	engineMaxBodyBytes = 16 << 20
	// MaxLegGrowth bounds how many bytes a leg's body has beyond the
	// client's: the prefill leg adds under 300 bytes (stream, max_tokens and
	// prefillKVParams), the decode leg the prefill's kv_transfer_params,
	// some 300 bytes plus about 8 per KV block of the prompt, so 1 MiB
	// covers prompts of over a million tokens. Conversation mode's history
	// params, on the prefill leg, are of the same size. (A client key that
	// json.Marshal escapes, such as "<", grows up to 6-fold when the proxy
	// writes it: such a body may get the engine's 413, relayed.)
	MaxLegGrowth = 1 << 20
	// DefaultMaxBodyBytes is Config.MaxBodyBytes's default: a client body
	// at this limit still fits an engine's default limit after the proxy's
	// edits.
	DefaultMaxBodyBytes = engineMaxBodyBytes - MaxLegGrowth
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
	// Validate first (encoding/json's scanner, no allocation), then cut the
	// object into keys and raw values with a scanner that may assume
	// validity: one pass each, instead of json.Decoder's token by token.
	if !json.Valid(b) {
		var v any
		err := json.Unmarshal(b, &v) // for its message
		if err == nil {
			err = errors.New("invalid")
		}
		return nil, fmt.Errorf("body is not valid JSON: %w", err)
	}
	i := skipSpace(b, 0)
	if b[i] != '{' {
		return nil, errors.New("body must be a JSON object")
	}
	o := &object{vals: make(map[string]json.RawMessage)}
	err := eachField(b, i, func(rawKey, val []byte) error {
		key, err := objectKey(rawKey)
		if err != nil {
			return err
		}
		o.set(key, val)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return o, nil
}

// eachField calls f with each field of the valid JSON object whose opening
// brace is at i: its key as written (quotes and escapes included) and its
// raw value, in order.
func eachField(b []byte, i int, f func(rawKey, val []byte) error) error {
	i = skipSpace(b, i+1)
	if b[i] == '}' {
		return nil
	}
	for {
		end := skipString(b, i)
		rawKey := b[i:end]
		i = skipSpace(b, end)
		i = skipSpace(b, i+1) // the colon
		end = skipValue(b, i)
		if err := f(rawKey, b[i:end:end]); err != nil {
			return err
		}
		i = skipSpace(b, end)
		if b[i] == '}' {
			return nil
		}
		i = skipSpace(b, i+1) // the comma
	}
}

// isKey reports whether rawKey, a key as written, decodes to key.
func isKey(rawKey []byte, key string) bool {
	if len(rawKey) == len(key)+2 && string(rawKey[1:len(rawKey)-1]) == key {
		return true
	}
	if bytes.IndexByte(rawKey, '\\') < 0 {
		return false // without escapes, a key's bytes are what it decodes to
	}
	k, err := objectKey(rawKey)
	return err == nil && k == key
}

// objectKey decodes a key: its bytes when it is plain ASCII without
// escapes, else what encoding/json reads (escapes decoded, invalid UTF-8
// replaced).
func objectKey(raw []byte) (string, error) {
	plain := true
	for _, c := range raw[1 : len(raw)-1] {
		if c == '\\' || c >= 0x80 {
			plain = false
			break
		}
	}
	if plain {
		return string(raw[1 : len(raw)-1]), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("body is not valid JSON: key %s: %w", raw, err)
	}
	return s, nil
}

// The skip functions below walk valid JSON (json.Valid has said so): each
// returns the index just after what starts at i.

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString skips the string whose opening quote is at i.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue skips the value at i.
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipString(b, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return i
	}
	// A number, true, false or null: up to the next delimiter.
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
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
	n := 2
	for _, k := range o.keys {
		n += len(k) + 4 + len(o.vals[k])
	}
	b.Grow(n)
	b.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		writeKey(&b, k)
		b.WriteByte(':')
		b.Write(o.vals[k])
	}
	b.WriteByte('}')
	return b.Bytes()
}

// writeKey writes k as a JSON string, as json.Marshal spells it.
func writeKey(b *bytes.Buffer, k string) {
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			kb, _ := json.Marshal(k) // a string never fails to marshal
			b.Write(kb)
			return
		}
	}
	b.WriteByte('"')
	b.WriteString(k)
	b.WriteByte('"')
}

// prefillKVParams asks the prefill engine to keep the prompt's KV for a
// remote decode. They marshal with the null placeholders of vLLM's toy
// proxy, so that engines which validate the shape accept them.
var prefillKVParams = kvparams.Params{DoRemoteDecode: true}.Raw()

// kvParamsKey is the body field that carries P/D state between engines.
// The proxy writes it on both legs and never forwards a client's.
const kvParamsKey = "kv_transfer_params"

// prefillBody turns the client's request into the prefill leg's: one token,
// one sample, no streaming, no minimum lengths, and kv (prefillKVParams, or
// in conversation mode a decode's params naming the history's KV) asking P
// to hold the KV for a remote decode (docs/kv-transfer.md, "Prefill leg"), replacing
// whatever kv_transfer_params the client sent.
//
// n is set to 1 only when the client sent it: 1 is every engine's default
// (OpenAI's, vLLM's, Tandem's), so an absent n already asks for one sample
// and the leg stays as close to the client's body as it can. best_of goes:
// it asks for more samples than n.
func prefillBody(client *object, kv json.RawMessage) []byte {
	return client.marshalEdited(
		fieldEdit{key: "stream", val: json.RawMessage(`false`)},
		fieldEdit{key: "max_tokens", val: json.RawMessage(`1`)},
		fieldEdit{key: "max_completion_tokens", val: json.RawMessage(`1`), ifPresent: true},
		fieldEdit{key: "n", val: json.RawMessage(`1`), ifPresent: true},
		fieldEdit{key: "best_of"},
		fieldEdit{key: "stream_options"},
		fieldEdit{key: "min_tokens"},
		fieldEdit{key: "min_completion_tokens"},
		fieldEdit{key: kvParamsKey, val: kv},
	)
}

// decodeBody is the client's request with kv_transfer_params set to what the
// prefill engine returned, verbatim (docs/kv-transfer.md, "Decode leg"), replacing whatever
// the client sent.
func decodeBody(client *object, kv json.RawMessage) []byte {
	return client.marshalEdited(fieldEdit{key: kvParamsKey, val: kv})
}

// fieldEdit is one field marshalEdited changes: key (matched under case
// folding) set to val, or dropped when val is nil; when ifPresent, only a
// field the object has is set.
type fieldEdit struct {
	key       string
	val       json.RawMessage
	ifPresent bool
}

// marshalEdited writes o with edits applied, without changing o: the same
// bytes as setFolded for each edit in turn on a clone, then marshal. A set
// field takes the place of the first key equal to it under folding, the
// other such keys go; a field o lacks is appended, in the edits' order.
func (o *object) marshalEdited(edits ...fieldEdit) []byte {
	var placed uint64 // bit j: edits[j] has been written
	n := 2
	for _, k := range o.keys {
		n += len(k) + 4 + len(o.vals[k])
	}
	for _, e := range edits {
		n += len(e.key) + 4 + len(e.val)
	}
	var b bytes.Buffer
	b.Grow(n)
	b.WriteByte('{')
	field := func(k string, v []byte) {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		writeKey(&b, k)
		b.WriteByte(':')
		b.Write(v)
	}
	for _, k := range o.keys {
		j := slices.IndexFunc(edits, func(e fieldEdit) bool { return strings.EqualFold(e.key, k) })
		switch {
		case j < 0:
			field(k, o.vals[k])
		case edits[j].val != nil && placed&(1<<j) == 0:
			placed |= 1 << j
			field(edits[j].key, edits[j].val)
		}
	}
	for j, e := range edits {
		if e.val != nil && !e.ifPresent && placed&(1<<j) == 0 {
			field(e.key, e.val)
		}
	}
	b.WriteByte('}')
	return b.Bytes()
}

// fallbackBody is the decode leg's body when the prefill leg failed: the
// client's bytes untouched, or, when the client sent kv_transfer_params, its
// fields without them. Client-written params would make the decode engine
// dial wherever they point.
func fallbackBody(raw []byte, client *object) []byte {
	if !client.hasFolded(kvParamsKey) {
		return raw
	}
	return client.marshalEdited(fieldEdit{key: kvParamsKey})
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
	if !json.Valid(resp) {
		_, err := parseObject(resp) // for its message
		return nil, err
	}
	i := skipSpace(resp, 0)
	if resp[i] != '{' {
		return nil, errors.New("body must be a JSON object")
	}
	var kv json.RawMessage
	err := eachField(resp, i, func(rawKey, val []byte) error {
		if isKey(rawKey, kvParamsKey) {
			kv = val // the last one, as parseObject keeps it
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	kv = bytes.TrimSpace(kv)
	if len(kv) == 0 || kv[0] != '{' {
		return nil, nil
	}
	return kv, nil
}
