package kvparams

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"unicode/utf8"
)

// fastSet parses the usual shapes of the known fields straight from their
// JSON text (already validated by the object's unmarshal): plain strings,
// digit-only integers, lists of them. It reports false for anything else
// (null, escapes, floats, a value out of range, an unknown key) and leaves
// that to the general path, which also writes the error messages: the
// general path decodes into `any`, boxing every block id, and was most of
// a parse.
func fastSet(p *Params, key string, raw []byte) bool {
	switch key {
	case "do_remote_decode":
		return fastBool(raw, &p.DoRemoteDecode)
	case "do_remote_prefill":
		return fastBool(raw, &p.DoRemotePrefill)
	case "remote_engine_id":
		return fastString(raw, &p.RemoteEngineID, 1, math.MaxInt)
	case "remote_request_id":
		return fastString(raw, &p.RemoteRequestID, 1, math.MaxInt)
	case "remote_host":
		return fastString(raw, &p.RemoteHost, 1, math.MaxInt)
	case "tandem_prompt_digest":
		return fastString(raw, &p.PromptDigest, 1, math.MaxInt)
	case "tandem_signature":
		return fastString(raw, &p.Signature, 1, 256)
	case "transfer_mode":
		return fastString(raw, &p.TransferMode, 0, math.MaxInt)
	case "remote_port":
		return fastInt(raw, &p.RemotePort, 1, 65535)
	case "remote_num_tokens":
		return fastInt(raw, &p.RemoteNumTokens, 1, math.MaxInt32)
	case "tp_size":
		return fastInt(raw, &p.TPSize, 1, math.MaxInt32)
	case "dcp_size":
		return fastInt(raw, &p.DCPSize, 1, math.MaxInt32)
	case "pp_size":
		return fastInt(raw, &p.PPSize, 1, math.MaxInt32)
	case "remote_registration_generation":
		g, ok := decimalString(raw)
		return store(&p.RemoteRegistrationGeneration, g, ok)
	case "remote_block_ids":
		ids, ok := fastBlockIDs(raw)
		return store(&p.RemoteBlockIDs, ids, ok)
	case "tandem_history":
		h, ok := fastStrings(raw)
		return store(&p.History, h, ok)
	}
	return false
}

// store sets *dst to v when ok, and reports ok: a field keeps its zero
// value when its text is left to the general path.
func store[T any](dst *T, v T, ok bool) bool {
	if ok {
		*dst = v
	}
	return ok
}

func fastBool(raw []byte, dst *bool) bool {
	switch string(raw) {
	case "true":
		*dst = true
	case "false":
		*dst = false
	default:
		return false
	}
	return true
}

// fastString reads a plain string of minLen to maxLen bytes.
func fastString(raw []byte, dst *string, minLen, maxLen int) bool {
	s, ok := plainString(raw)
	return store(dst, s, ok && len(s) >= minLen && len(s) <= maxLen)
}

// fastInt reads a digit-only integer from lo to hi.
func fastInt(raw []byte, dst *int, lo, hi int64) bool {
	n, ok := digits(raw)
	if !ok || n < lo || n > hi {
		return false
	}
	*dst = int(n)
	return true
}

// decimalString is a uint64 written as a plain string of decimal digits.
func decimalString(raw []byte) (uint64, bool) {
	s, ok := plainString(raw)
	if !ok {
		return 0, false
	}
	g, err := strconv.ParseUint(s, 10, 64)
	return g, err == nil
}

// plainString is a JSON string without escapes and in valid UTF-8 (what
// encoding/json would decode byte for byte; it replaces invalid UTF-8).
func plainString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	body := raw[1 : len(raw)-1]
	if bytes.IndexByte(body, '\\') >= 0 || !utf8.Valid(body) {
		return "", false
	}
	return string(body), true
}

// digits is a JSON number written with digits only, at most 18 of them.
func digits(raw []byte) (int64, bool) {
	if len(raw) == 0 || len(raw) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// scanner walks validated JSON text.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek is the next byte after white space, 0 at the end.
func (s *scanner) peek() byte {
	s.space()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// uint32s reads a list of digit-only integers up to MaxInt32: [1, 2, 3].
func (s *scanner) uint32s() ([]int, bool) {
	if s.peek() != '[' {
		return nil, false
	}
	s.i++
	out := make([]int, 0, 16)
	if s.peek() == ']' {
		s.i++
		return out, true
	}
	for {
		s.space()
		start := s.i
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
		n, ok := digits(s.b[start:s.i])
		if !ok || n > math.MaxInt32 {
			return nil, false
		}
		out = append(out, int(n))
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return out, true
		default:
			return nil, false
		}
	}
}

// fastBlockIDs reads remote_block_ids written as [[ids], [ids]] or a flat
// [ids] (one group), the shapes blockIDs accepts.
func fastBlockIDs(raw []byte) ([][]int, bool) {
	s := scanner{b: raw}
	if s.peek() != '[' {
		return nil, false
	}
	open := s.i
	s.i++
	if s.peek() != '[' { // flat: one group
		s.i = open
		ids, ok := s.uint32s()
		if !ok || s.peek() != 0 {
			return nil, false
		}
		return [][]int{ids}, true
	}
	var out [][]int
	for {
		ids, ok := s.uint32s()
		if !ok {
			return nil, false
		}
		out = append(out, ids)
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return out, s.peek() == 0
		default:
			return nil, false
		}
	}
}

// fastStrings reads a list of plain strings.
func fastStrings(raw []byte) ([]string, bool) {
	s := scanner{b: raw}
	if s.peek() != '[' {
		return nil, false
	}
	s.i++
	out := []string{}
	if s.peek() == ']' {
		s.i++
		return out, s.peek() == 0
	}
	for {
		if s.peek() != '"' {
			return nil, false
		}
		start := s.i
		s.i++
		for s.i < len(s.b) && s.b[s.i] != '"' {
			if s.b[s.i] == '\\' {
				return nil, false
			}
			s.i++
		}
		if s.i >= len(s.b) {
			return nil, false
		}
		s.i++
		str, ok := plainString(s.b[start:s.i])
		if !ok {
			return nil, false
		}
		out = append(out, str)
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return out, s.peek() == 0
		default:
			return nil, false
		}
	}
}

// members splits a JSON object into its members without copying them: the
// values alias data. It returns nil, leaving the object to encoding/json,
// for anything but a valid object whose keys are plain strings, each once
// (encoding/json keeps a repeated key's last value; the general path
// decides what that means for the errors).
func members(data []byte) map[string]json.RawMessage {
	if !json.Valid(data) {
		return nil
	}
	s := scanner{b: data}
	if s.peek() != '{' {
		return nil
	}
	s.i++
	obj := make(map[string]json.RawMessage, 8)
	if s.peek() == '}' {
		return obj
	}
	for {
		if s.peek() != '"' {
			return nil
		}
		start := s.i
		s.skipString()
		key, ok := plainString(s.b[start:s.i])
		if !ok {
			return nil
		}
		if _, dup := obj[key]; dup {
			return nil
		}
		if s.peek() != ':' {
			return nil
		}
		s.i++
		s.space()
		start = s.i
		s.skipValue()
		obj[key] = s.b[start:s.i]
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			return obj
		default:
			return nil
		}
	}
}

// skipString moves past the string that starts at s.i (valid JSON).
func (s *scanner) skipString() {
	for s.i++; s.i < len(s.b); s.i++ {
		switch s.b[s.i] {
		case '\\':
			s.i++
		case '"':
			s.i++
			return
		}
	}
}

// skipValue moves past the value that starts at s.i (valid JSON).
func (s *scanner) skipValue() {
	depth := 0
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case '"':
			s.skipString()
			if depth == 0 {
				return
			}
			continue
		case '[', '{':
			depth++
		case ']', '}':
			if depth == 0 {
				return
			}
			depth--
			if depth == 0 {
				s.i++
				return
			}
		case ',':
			if depth == 0 {
				return
			}
		case ' ', '\t', '\n', '\r':
			if depth == 0 {
				return
			}
		}
		s.i++
	}
}

func blockCount(ids [][]int) int {
	n := 0
	for _, g := range ids {
		n += len(g)
	}
	return n
}

// appendFast appends the JSON of the common values MarshalJSON writes
// (bools, ints, strings that need no escaping, block-id lists, string
// lists) as json.Marshal writes them; nil for any other value, which the
// caller marshals with encoding/json.
func appendFast(dst []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(dst, "null"...)
	case bool:
		return strconv.AppendBool(dst, v)
	case int:
		return strconv.AppendInt(dst, int64(v), 10)
	case string:
		if !plain(v) {
			return nil
		}
		return append(append(append(dst, '"'), v...), '"')
	case [][]int:
		if v == nil {
			return append(dst, "null"...)
		}
		dst = append(dst, '[')
		for g, ids := range v {
			if g > 0 {
				dst = append(dst, ',')
			}
			if ids == nil {
				dst = append(dst, "null"...)
				continue
			}
			dst = append(dst, '[')
			for i, id := range ids {
				if i > 0 {
					dst = append(dst, ',')
				}
				dst = strconv.AppendInt(dst, int64(id), 10)
			}
			dst = append(dst, ']')
		}
		return append(dst, ']')
	case []string:
		if v == nil {
			return append(dst, "null"...)
		}
		dst = append(dst, '[')
		for i, s := range v {
			if !plain(s) {
				return nil
			}
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(append(append(dst, '"'), s...), '"')
		}
		return append(dst, ']')
	}
	return nil
}

// plain: s is printable ASCII that encoding/json writes unescaped (it
// escapes quotes, backslashes and, for HTML, <, > and &).
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}
