package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/tandem-serve/tandem/internal/kvparams"
)

// DecodeBody reads r's body, at most limit bytes, and unmarshals the JSON
// object in it into v. Unknown fields are ignored; a body over the limit is a
// 413, anything else wrong a 400 that names the field when there is one.
func DecodeBody(r *http.Request, limit int64, v any) *Error {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, limit))
	if err != nil {
		if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return NewError(http.StatusRequestEntityTooLarge, "", "request body is larger than the limit of %d bytes", mbe.Limit)
		}
		return BadRequest("", "reading request body: %v", err)
	}
	return decodeJSON(body, v)
}

func decodeJSON(body []byte, v any) *Error {
	if len(bytes.TrimSpace(body)) == 0 {
		return BadRequest("", "request body is empty; send a JSON object")
	}
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	if typeErr, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		if typeErr.Field == "" {
			return BadRequest("", "request body must be a JSON object, not %s", typeErr.Value)
		}
		field := jsonPath(typeErr.Field)
		return BadRequest(field, "invalid type for %q: expected %s, got %s", field, jsonTypeName(typeErr.Type.Kind().String()), typeErr.Value)
	}
	return BadRequest("", "invalid JSON in request body: %v", err)
}

// jsonPath drops the names of embedded Go structs (which start with an
// upper-case letter, unlike every JSON key of the API) from an
// UnmarshalTypeError's field path.
func jsonPath(field string) string {
	parts := strings.Split(field, ".")
	out := parts[:0]
	for _, p := range parts {
		if p != "" && p[0] >= 'A' && p[0] <= 'Z' {
			continue
		}
		out = append(out, p)
	}
	return strings.Join(out, ".")
}

// jsonTypeName names a Go kind the way a JSON user thinks of it.
func jsonTypeName(kind string) string {
	switch {
	case strings.HasPrefix(kind, "int"), strings.HasPrefix(kind, "uint"):
		return "integer"
	case strings.HasPrefix(kind, "float"):
		return "number"
	case kind == "bool":
		return "boolean"
	case kind == "slice", kind == "array":
		return "array"
	case kind == "map", kind == "struct":
		return "object"
	default:
		return kind
	}
}

// isNull reports whether raw is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// Prompt is one prompt of a completion request: text to tokenize or token
// ids as given.
type Prompt struct {
	Text   string
	Tokens []int32
	// IsTokens says the prompt was given as token ids.
	IsTokens bool
}

// ParsePrompt parses a completion request's prompt field: a string, a list
// of token ids, a list of strings or a list of token-id lists.
func ParsePrompt(raw json.RawMessage) ([]Prompt, *Error) {
	if isNull(raw) {
		return nil, BadRequest("prompt", "prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []Prompt{{Text: s}}, nil
	}
	var ids []int32
	if json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return nil, BadRequest("prompt", "prompt must not be empty")
		}
		return []Prompt{{Tokens: ids, IsTokens: true}}, nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		ps := make([]Prompt, len(texts))
		for i, t := range texts {
			ps[i] = Prompt{Text: t}
		}
		return ps, nil
	}
	var lists [][]int32
	if json.Unmarshal(raw, &lists) == nil {
		ps := make([]Prompt, len(lists))
		for i, l := range lists {
			ps[i] = Prompt{Tokens: l, IsTokens: true}
		}
		return ps, nil
	}
	return nil, BadRequest("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists")
}

// parseStop parses the stop field: null, a string or a list of strings.
func parseStop(raw json.RawMessage) ([]string, *Error) {
	if isNull(raw) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return nil, nil
		}
		return []string{s}, nil
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil {
		out := list[:0]
		for _, s := range list {
			if s != "" {
				out = append(out, s)
			}
		}
		return out, nil
	}
	return nil, BadRequest("stop", "stop must be a string or a list of strings")
}

// parseKVTransfer parses kv_transfer_params, null or a JSON object, where
// they enter the engine: the engine and its KV connector get them typed.
func parseKVTransfer(raw json.RawMessage) (*kvparams.Params, *Error) {
	if isNull(raw) {
		return nil, nil
	}
	p, err := kvparams.Parse(raw)
	if err != nil {
		return nil, BadRequest("kv_transfer_params", "%s", err)
	}
	return &p, nil
}

// Message is one chat message reduced to text, ready for a chat template.
type Message struct {
	Role    string
	Content string
}

var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// ParseMessages reduces chat messages to role and text. Content may be a
// string, null, or an array of text parts, which are joined with newlines
// (as vLLM does for string-based templates).
func ParseMessages(msgs []ChatMessage) ([]Message, *Error) {
	if len(msgs) == 0 {
		return nil, BadRequest("messages", "messages must not be empty")
	}
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		param := "messages[" + itoa(i) + "]"
		if !chatRoles[m.Role] {
			return nil, BadRequest(param+".role", "unsupported role %q; use system, developer, user, assistant or tool", m.Role)
		}
		text, err := parseContent(m.Content, param+".content")
		if err != nil {
			return nil, err
		}
		out[i] = Message{Role: m.Role, Content: text}
	}
	return out, nil
}

type contentPart struct {
	Type string  `json:"type"`
	Text *string `json:"text"`
}

func parseContent(raw json.RawMessage, param string) (string, *Error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []contentPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", BadRequest(param, "content must be a string or an array of text parts")
	}
	texts := make([]string, 0, len(parts))
	for j, p := range parts {
		if p.Type != "text" {
			return "", BadRequest(param+"["+itoa(j)+"].type", "content part type %q is not supported; only text parts are", p.Type)
		}
		if p.Text == nil {
			return "", BadRequest(param+"["+itoa(j)+"].text", "text part has no text")
		}
		texts = append(texts, *p.Text)
	}
	return strings.Join(texts, "\n"), nil
}
