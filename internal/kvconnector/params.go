package kvconnector

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

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
	// remote says where KV to pull is, with the tokens it covers (numTokens)
	// and the issuer's signature: for a decode leg, the prefill's blocks
	// of the whole prompt; for a turn-2 prefill (remoteDecode too), the
	// blocks of the conversation a decode holds.
	remote    *kvxfer.RemoteParams
	numTokens int
	signature string
	// history is the decode's hash chain over the held tokens, one entry
	// per block (the last may cover a partial block); turn-2 prefills only.
	history []string
	// digest is what the signature covers of the tokens: a decode leg's
	// prompt digest (promptDigestParam, as sent), a turn-2 prefill's
	// history chain digest.
	digest string
}

// grant is what the issuer of the params vouched for.
func (k kvRequest) grant() kvxfer.Grant {
	r := k.remote
	return kvxfer.Grant{EngineID: r.EngineID, RequestID: r.RequestID, Host: r.Host, Port: r.Port, BlockIDs: r.BlockIDs,
		NumTokens: k.numTokens, Digest: k.digest}
}

// kvParam is the request field that 400s name.
const kvParam = "kv_transfer_params"

func invalid(format string, args ...any) error {
	return &engine.InvalidRequestError{Message: fmt.Sprintf(format, args...), Param: kvParam}
}

// parseKV parses kv_transfer_params for a prompt of promptLen tokens on an
// engine with blockSize-token blocks. The keys are vLLM's (NIXL connector);
// unknown keys are ignored, as vLLM does. Numbers may come as JSON decodes
// them (float64, json.Number) or as Go integers. With history, a
// do_remote_decode request may also name a decode's conversation hold
// (vLLM's bidirectional mode); without, those fields are ignored.
func parseKV(kv map[string]any, promptLen, blockSize int, history bool) (kvRequest, error) {
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
		if !history {
			return out, nil
		}
		if v, ok := kv["remote_engine_id"]; !ok || v == nil {
			return out, nil // turn 1: no conversation to pull
		}
		n, ok := asInt(kv["remote_num_tokens"])
		if !ok || n < 1 || n > math.MaxInt32 {
			return out, invalid("remote_num_tokens must be the number of tokens the decode engine holds, got %s", describe(kv["remote_num_tokens"]))
		}
		if err := parseRemote(kv, &out, int(n), blockSize); err != nil {
			return out, err
		}
		chain, err := hashList(kv[historyParam], int(n), blockSize)
		if err != nil {
			return out, err
		}
		out.history = chain
		out.digest = chainDigest(chain)
		if v, ok := kv["remote_blocks_expiry_time"]; ok && v != nil {
			f, ok := v.(float64)
			if !ok || f <= 0 || math.IsInf(f, 0) || math.IsNaN(f) {
				return out, invalid("remote_blocks_expiry_time must be a time in seconds, got %s", describe(v))
			}
			out.remote.Deadline = time.Unix(0, int64(f*1e9))
		}
		return out, nil
	case !prefill:
		return out, nil
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
	if err := parseRemote(kv, &out, promptLen, blockSize); err != nil {
		return out, err
	}
	if v, ok := kv[promptDigestParam]; ok && v != nil {
		d, ok := v.(string)
		if !ok || len(d) != 2*sha256.Size {
			return out, invalid("%s must be the prefill's digest of the prompt (%d hex digits), got %s: pass the prefill's kv_transfer_params verbatim", promptDigestParam, 2*sha256.Size, describe(v))
		}
		out.digest = d
	}
	return out, nil
}

// parseRemote parses the remote_* identity, block and signature fields of
// KV covering numTokens tokens into out.
func parseRemote(kv map[string]any, out *kvRequest, numTokens, blockSize int) error {
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
			return err
		}
	}
	if v, ok := kv["remote_port"]; !ok || v == nil {
		missing = append(missing, "remote_port")
	} else if p, ok := asInt(v); !ok || p < 1 || p > 65535 {
		return invalid("remote_port must be a TCP port (1-65535), got %s", describe(v))
	} else {
		r.Port = int(p)
	}
	if v, ok := kv["remote_block_ids"]; !ok || v == nil {
		missing = append(missing, "remote_block_ids")
	} else {
		ids, err := blockIDs(v)
		if err != nil {
			return err
		}
		r.BlockIDs = ids
	}
	if len(missing) > 0 {
		return invalid("kv_transfer_params name remote KV but %s missing: pass the kv_transfer_params of the engine's response verbatim", plural(missing))
	}
	if v, ok := kv["tp_size"]; ok && v != nil {
		if n, ok := asInt(v); !ok || n != 1 {
			return invalid("tp_size %s is not supported: Tandem engines run with tensor parallelism 1, so the prefill engine must too", describe(v))
		}
	}
	if want := (numTokens + blockSize - 1) / blockSize; len(r.BlockIDs) != want {
		return invalid("remote_block_ids lists %d blocks but the %d-token prompt fills %d blocks of %d tokens on this engine: send the same prompt as the prefill leg, and start both engines with the same --block-size",
			len(r.BlockIDs), numTokens, want, blockSize)
	}
	if v, ok := kv["remote_registration_generation"]; ok && v != nil {
		s, ok := v.(string)
		g, err := strconv.ParseUint(s, 10, 64)
		if !ok || err != nil {
			return invalid("remote_registration_generation must be the engine's generation (a decimal string), got %s", describe(v))
		}
		r.Generation = g
	}
	if v, ok := kv[kvxfer.SignatureParam]; ok && v != nil {
		sig, ok := v.(string)
		if !ok || len(sig) > 256 {
			return invalid("%s must be the issuing engine's signature string, got %s", kvxfer.SignatureParam, describe(v))
		}
		out.signature = sig
	}
	out.remote = &r
	out.numTokens = numTokens
	return nil
}

// historyParam carries a decode's hash chain over the conversation it
// holds.
const historyParam = "tandem_history"

// hashList parses the history chain: one hex hash per block of numTokens.
func hashList(v any, numTokens, blockSize int) ([]string, error) {
	l, ok := v.([]any)
	want := (numTokens + blockSize - 1) / blockSize
	if !ok || len(l) != want {
		return nil, invalid("%s must list one hash per held block (%d), got %s: pass the decode engine's kv_transfer_params verbatim", historyParam, want, describe(v))
	}
	out := make([]string, len(l))
	for i, x := range l {
		s, ok := x.(string)
		if !ok || len(s) != 2*chainHashBytes {
			return nil, invalid("%s[%d] is not a block hash", historyParam, i)
		}
		out[i] = s
	}
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
