package kvparams

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// Params is a kv_transfer_params object. A zero field was absent (or
// null): Parse refuses the zero value of every field that may not be zero
// when present (an empty string, port 0, a non-positive count).
type Params struct {
	// DoRemoteDecode marks the prefill leg: prefill here, hold the KV for a
	// decode engine (vLLM).
	DoRemoteDecode bool `json:"do_remote_decode"`
	// DoRemotePrefill marks the decode leg: pull the prompt's KV from the
	// engine the remote fields name (vLLM).
	DoRemotePrefill bool `json:"do_remote_prefill"`
	// RemoteEngineID, RemoteBlockIDs (one list per KV-cache group),
	// RemoteHost and RemotePort name the engine holding the KV, and its
	// blocks (vLLM). MarshalJSON writes them as null when zero, as vLLM's
	// proxy does in a prefill leg's request.
	RemoteEngineID string  `json:"remote_engine_id"`
	RemoteBlockIDs [][]int `json:"remote_block_ids"`
	RemoteHost     string  `json:"remote_host"`
	RemotePort     int     `json:"remote_port"`
	// RemoteRequestID is the holding engine's id of the request (vLLM).
	RemoteRequestID string `json:"remote_request_id,omitempty"`
	// RemoteNumTokens is how many tokens the named KV covers (Tandem's).
	RemoteNumTokens int `json:"remote_num_tokens,omitempty"`
	// TPSize, DCPSize and PPSize are the holding engine's tensor,
	// decode-context and pipeline parallel sizes (vLLM).
	TPSize  int `json:"tp_size,omitempty"`
	DCPSize int `json:"dcp_size,omitempty"`
	PPSize  int `json:"pp_size,omitempty"`
	// TransferMode is "pull" for Tandem's engines (vLLM).
	TransferMode string `json:"transfer_mode,omitempty"`
	// RemoteRegistrationGeneration is the holding engine's KV memory
	// generation, a decimal string on the wire (Tandem's); 0 is not
	// written, as it checks nothing.
	RemoteRegistrationGeneration uint64 `json:"remote_registration_generation,omitempty,string"`
	// RemoteBlocksExpiryTime is when a decode's conversation hold ends
	// (vLLM's bidirectional mode): Unix seconds from Tandem's decodes, the
	// decode host's perf_counter seconds from vLLM's; UnixExpiry tells
	// them apart.
	RemoteBlocksExpiryTime float64 `json:"remote_blocks_expiry_time,omitempty"`
	// History is a decode's hash chain over the tokens of a conversation
	// hold, one hex hash per block (Tandem's).
	History []string `json:"tandem_history,omitempty"`
	// PromptDigest is the digest of the prompt whose KV a prefill holds
	// (Tandem's).
	PromptDigest string `json:"tandem_prompt_digest,omitempty"`
	// Signature is the issuing engine's signature over the fields a pull
	// uses (Tandem's).
	Signature string `json:"tandem_signature,omitempty"`
	// Extra holds the keys Parse does not know, verbatim.
	Extra map[string]json.RawMessage `json:"-"`
}

// FieldError is a field of the wrong type or range. Message names the
// field and says what it must be.
type FieldError struct {
	Field   string
	Message string
}

// Error returns the Message.
func (e *FieldError) Error() string { return e.Message }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// Parse parses a kv_transfer_params object. Numbers may be written as
// integers or as integral floats (5600.0); a null field counts as absent.
func Parse(data []byte) (Params, error) { return parse(data, true) }

// parse is Parse; with fast false every field takes the general path (the
// fuzz test checks both give the same answer for every input).
func parse(data []byte, fast bool) (Params, error) {
	var p Params
	var obj map[string]json.RawMessage
	if fast {
		obj = members(data)
	}
	if obj == nil {
		if err := json.Unmarshal(data, &obj); err != nil || obj == nil {
			return p, &FieldError{Message: "kv_transfer_params must be a JSON object"}
		}
	}
	for key, raw := range obj {
		if fast && fastSet(&p, key, raw) {
			continue
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return p, fieldErr(key, "%s is not valid JSON", key)
		}
		if v == nil {
			continue
		}
		set, known := setters[key]
		if !known {
			if p.Extra == nil {
				p.Extra = make(map[string]json.RawMessage)
			}
			p.Extra[key] = slices.Clone(raw)
			continue
		}
		if err := set(&p, key, v); err != nil {
			return p, err
		}
	}
	return p, nil
}

// UnmarshalJSON implements json.Unmarshaler with Parse; null leaves p as it
// is.
func (p *Params) UnmarshalJSON(data []byte) error {
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return nil
	}
	q, err := Parse(data)
	if err != nil {
		return err
	}
	*p = q
	return nil
}

// setters parse each known key into its field.
var setters = map[string]func(p *Params, key string, v any) error{
	"do_remote_decode":  func(p *Params, k string, v any) error { return boolean(k, v, &p.DoRemoteDecode) },
	"do_remote_prefill": func(p *Params, k string, v any) error { return boolean(k, v, &p.DoRemotePrefill) },
	"remote_engine_id":  func(p *Params, k string, v any) error { return nonEmpty(k, v, &p.RemoteEngineID) },
	"remote_request_id": func(p *Params, k string, v any) error { return nonEmpty(k, v, &p.RemoteRequestID) },
	"remote_host":       func(p *Params, k string, v any) error { return nonEmpty(k, v, &p.RemoteHost) },
	"remote_port": func(p *Params, k string, v any) error {
		n, ok := asInt(v)
		if !ok || n < 1 || n > 65535 {
			return fieldErr(k, "remote_port must be a TCP port (1-65535), got %s", describe(v))
		}
		p.RemotePort = int(n)
		return nil
	},
	"remote_block_ids": func(p *Params, k string, v any) (err error) {
		p.RemoteBlockIDs, err = blockIDs(v)
		return err
	},
	"remote_num_tokens": func(p *Params, k string, v any) error { return positive(k, v, &p.RemoteNumTokens) },
	"tp_size":           func(p *Params, k string, v any) error { return positive(k, v, &p.TPSize) },
	"dcp_size":          func(p *Params, k string, v any) error { return positive(k, v, &p.DCPSize) },
	"pp_size":           func(p *Params, k string, v any) error { return positive(k, v, &p.PPSize) },
	"transfer_mode": func(p *Params, k string, v any) error {
		s, ok := v.(string)
		if !ok {
			return fieldErr(k, "transfer_mode must be a string, got %s", describe(v))
		}
		p.TransferMode = s
		return nil
	},
	"remote_registration_generation": func(p *Params, k string, v any) error {
		s, ok := v.(string)
		g, err := strconv.ParseUint(s, 10, 64)
		if !ok || err != nil {
			return fieldErr(k, "remote_registration_generation must be the engine's generation (a decimal string), got %s", describe(v))
		}
		p.RemoteRegistrationGeneration = g
		return nil
	},
	"remote_blocks_expiry_time": func(p *Params, k string, v any) error {
		f, ok := v.(float64)
		if !ok || f <= 0 || math.IsInf(f, 0) || math.IsNaN(f) {
			return fieldErr(k, "remote_blocks_expiry_time must be a time in seconds, got %s", describe(v))
		}
		p.RemoteBlocksExpiryTime = f
		return nil
	},
	"tandem_history": func(p *Params, k string, v any) error {
		l, ok := v.([]any)
		if !ok {
			return fieldErr(k, "tandem_history must be a list of block hashes, got %s: pass the decode engine's kv_transfer_params verbatim", describe(v))
		}
		p.History = make([]string, len(l))
		for i, x := range l {
			s, ok := x.(string)
			if !ok {
				return fieldErr(k, "tandem_history[%d] is not a block hash", i)
			}
			p.History[i] = s
		}
		return nil
	},
	"tandem_prompt_digest": func(p *Params, k string, v any) error { return nonEmpty(k, v, &p.PromptDigest) },
	"tandem_signature": func(p *Params, k string, v any) error {
		s, ok := v.(string)
		if !ok || s == "" || len(s) > 256 {
			return fieldErr(k, "tandem_signature must be the issuing engine's signature string, got %s", describe(v))
		}
		p.Signature = s
		return nil
	},
}

func boolean(key string, v any, dst *bool) error {
	b, ok := v.(bool)
	if !ok {
		return fieldErr(key, "%s must be true or false, got %s", key, describe(v))
	}
	*dst = b
	return nil
}

func nonEmpty(key string, v any, dst *string) error {
	s, ok := v.(string)
	if !ok || s == "" {
		return fieldErr(key, "%s must be a non-empty string, got %s", key, describe(v))
	}
	*dst = s
	return nil
}

func positive(key string, v any, dst *int) error {
	n, ok := asInt(v)
	if !ok || n < 1 || n > math.MaxInt32 {
		return fieldErr(key, "%s must be a positive integer, got %s", key, describe(v))
	}
	*dst = int(n)
	return nil
}

// blockIDs parses remote_block_ids: one list of block ids per KV-cache
// group, [[...]] (vLLM). A flat list (older vLLM) is one group.
func blockIDs(v any) ([][]int, error) {
	const key = "remote_block_ids"
	outer, ok := v.([]any)
	if !ok {
		return nil, fieldErr(key, "remote_block_ids must be a list of block-id lists, [[0, 1, ...]], got %s", describe(v))
	}
	groups := [][]any{outer}
	if len(outer) > 0 {
		if _, nested := outer[0].([]any); nested {
			groups = make([][]any, len(outer))
			for g, x := range outer {
				if groups[g], ok = x.([]any); !ok {
					return nil, fieldErr(key, "remote_block_ids[%d] must be a list of block ids, got %s", g, describe(x))
				}
			}
		}
	}
	out := make([][]int, len(groups))
	for g, group := range groups {
		out[g] = make([]int, len(group))
		for i, x := range group {
			n, ok := asInt(x)
			if !ok || n < 0 || n > math.MaxInt32 {
				return nil, fieldErr(key, "remote_block_ids[%d][%d] must be a block id (a non-negative integer), got %s", g, i, describe(x))
			}
			out[g][i] = int(n)
		}
	}
	return out, nil
}

// asInt returns v as an integer if it is an integral JSON number.
func asInt(v any) (int64, bool) {
	f, ok := v.(float64)
	if !ok || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, false
	}
	return int64(f), true
}

// describe renders a JSON value for an error message, briefly.
func describe(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%T", v)
	}
	s := string(b)
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	return s
}
