package kvconnector

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvxfer"
)

// Role is what a Connector lets its engine do with kv_transfer_params.
type Role string

const (
	// RolePrefill serves do_remote_decode requests (prefill here, hold the
	// KV for a decode engine) and plain requests.
	RolePrefill Role = "prefill"
	// RoleDecode serves do_remote_prefill requests (pull the KV from a
	// prefill engine, decode here) and plain requests.
	RoleDecode Role = "decode"
	// RoleBoth serves either kind, per request.
	RoleBoth Role = "both"
)

// ParseRole parses a --role value.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case RolePrefill, RoleDecode, RoleBoth:
		return r, nil
	}
	return "", fmt.Errorf("unknown role %q: use prefill, decode or both", s)
}

func (r Role) prefills() bool { return r == RolePrefill || r == RoleBoth }
func (r Role) decodes() bool  { return r == RoleDecode || r == RoleBoth }

// kvRequest is a request's kv_transfer_params, parsed.
type kvRequest struct {
	// remoteDecode: prefill here, then hold the KV for a decode engine.
	remoteDecode bool
	// remote is set for a remote prefill: where the prompt's KV is. Its
	// BlockIDs cover the whole prompt, in prompt order.
	remote *kvxfer.RemoteParams
	// signature is the prefill's kvxfer.SignatureParam ("" if absent).
	signature string
}

// grant is what a remote prefill's params claim, as the prefill signed it
// for a prompt of numTokens tokens.
func (k kvRequest) grant(numTokens int) kvxfer.Grant {
	r := k.remote
	return kvxfer.Grant{EngineID: r.EngineID, RequestID: r.RequestID, Host: r.Host, Port: r.Port, BlockIDs: r.BlockIDs, NumTokens: numTokens}
}

// kvParam is the request field that 400s name.
const kvParam = "kv_transfer_params"

func invalid(format string, args ...any) error {
	return &engine.InvalidRequestError{Message: fmt.Sprintf(format, args...), Param: kvParam}
}

// parseKV parses kv_transfer_params for a prompt of promptLen tokens on an
// engine with blockSize-token blocks. The keys are vLLM's (NIXL connector);
// unknown keys are ignored, as vLLM does. Numbers may come as JSON decodes
// them (float64, json.Number) or as Go integers.
func parseKV(kv map[string]any, promptLen, blockSize int) (kvRequest, error) {
	var out kvRequest
	decode, err := optBool(kv, "do_remote_decode")
	if err != nil {
		return out, err
	}
	prefill, err := optBool(kv, "do_remote_prefill")
	if err != nil {
		return out, err
	}
	switch {
	case decode && prefill:
		return out, invalid("do_remote_decode and do_remote_prefill are both true: a request is either the prefill leg (do_remote_decode) or the decode leg (do_remote_prefill) of a disaggregated request, not both")
	case decode:
		out.remoteDecode = true
		return out, nil
	case !prefill:
		return out, nil
	}

	var r kvxfer.RemoteParams
	var missing []string
	str := func(key string, dst *string) error {
		v, ok := kv[key]
		if !ok || v == nil {
			missing = append(missing, key)
			return nil
		}
		s, ok := v.(string)
		if !ok || s == "" {
			return invalid("%s must be a non-empty string, got %s", key, describe(v))
		}
		*dst = s
		return nil
	}
	for _, f := range []struct {
		key string
		dst *string
	}{{"remote_engine_id", &r.EngineID}, {"remote_request_id", &r.RequestID}, {"remote_host", &r.Host}} {
		if err := str(f.key, f.dst); err != nil {
			return out, err
		}
	}
	if v, ok := kv["remote_port"]; !ok || v == nil {
		missing = append(missing, "remote_port")
	} else if p, ok := asInt(v); !ok || p < 1 || p > 65535 {
		return out, invalid("remote_port must be a TCP port (1-65535), got %s", describe(v))
	} else {
		r.Port = int(p)
	}
	if v, ok := kv["remote_block_ids"]; !ok || v == nil {
		missing = append(missing, "remote_block_ids")
	} else {
		ids, err := blockIDs(v)
		if err != nil {
			return out, err
		}
		r.BlockIDs = ids
	}
	if len(missing) > 0 {
		return out, invalid("do_remote_prefill is true but %s missing: pass the kv_transfer_params of the prefill engine's response verbatim", plural(missing))
	}
	if v, ok := kv["tp_size"]; ok && v != nil {
		if n, ok := asInt(v); !ok || n != 1 {
			return out, invalid("tp_size %s is not supported: Tandem engines run with tensor parallelism 1, so the prefill engine must too", describe(v))
		}
	}
	if v, ok := kv["remote_num_tokens"]; ok && v != nil {
		n, ok := asInt(v)
		if !ok || n < 0 {
			return out, invalid("remote_num_tokens must be a non-negative integer, got %s", describe(v))
		}
		if int(n) != promptLen {
			return out, invalid("remote_num_tokens is %d but the prompt has %d tokens: the decode leg must send the same prompt as the prefill leg", n, promptLen)
		}
	}
	if want := (promptLen + blockSize - 1) / blockSize; len(r.BlockIDs) != want {
		return out, invalid("remote_block_ids lists %d blocks but the %d-token prompt fills %d blocks of %d tokens on this engine: send the same prompt as the prefill leg, and start both engines with the same --block-size",
			len(r.BlockIDs), promptLen, want, blockSize)
	}
	if v, ok := kv[kvxfer.SignatureParam]; ok && v != nil {
		sig, ok := v.(string)
		if !ok || len(sig) > 256 {
			return out, invalid("%s must be the prefill engine's signature string, got %s", kvxfer.SignatureParam, describe(v))
		}
		out.signature = sig
	}
	out.remote = &r
	return out, nil
}

// optBool reads an optional boolean; null counts as false.
func optBool(kv map[string]any, key string) (bool, error) {
	v, ok := kv[key]
	if !ok || v == nil {
		return false, nil
	}
	b, ok := v.(bool)
	if !ok {
		return false, invalid("%s must be true or false, got %s", key, describe(v))
	}
	return b, nil
}

// blockIDs parses remote_block_ids: one list of block ids per KV-cache
// group, [[...]] (vLLM); Tandem models have one group. A flat list (older
// vLLM) is accepted too.
func blockIDs(v any) ([]int, error) {
	groups, ok := asList(v)
	if !ok {
		return nil, invalid("remote_block_ids must be a list of block-id lists, [[0, 1, ...]], got %s", describe(v))
	}
	if len(groups) > 0 {
		if _, nested := asList(groups[0]); nested {
			if len(groups) != 1 {
				return nil, invalid("remote_block_ids has %d KV-cache groups; Tandem engines have one, so the prefill engine must serve the same model", len(groups))
			}
			groups, _ = asList(groups[0])
		}
	}
	ids := make([]int, len(groups))
	for i, g := range groups {
		n, ok := asInt(g)
		if !ok || n < 0 || n > math.MaxInt32 {
			return nil, invalid("remote_block_ids[0][%d] must be a block id (a non-negative integer), got %s", i, describe(g))
		}
		ids[i] = int(n)
	}
	return ids, nil
}

// asList returns v's elements if v is a list.
func asList(v any) ([]any, bool) {
	switch l := v.(type) {
	case []any:
		return l, true
	case []int:
		return anys(l), true
	case []int32:
		return anys(l), true
	case []int64:
		return anys(l), true
	case []float64:
		return anys(l), true
	case [][]int:
		return anys(l), true
	}
	return nil, false
}

func anys[T any](l []T) []any {
	out := make([]any, len(l))
	for i, x := range l {
		out[i] = x
	}
	return out
}

// asInt returns v as an integer if it is one (a float64 must be integral).
func asInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case float64:
		if n != math.Trunc(n) || math.Abs(n) > 1<<53 {
			return 0, false
		}
		return int64(n), true
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	}
	return 0, false
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

func plural(keys []string) string {
	if len(keys) == 1 {
		return keys[0] + " is"
	}
	return strings.Join(keys, ", ") + " are"
}
