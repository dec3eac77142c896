package kvconnector

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvparams"
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
	// groups are remote_block_ids: one list per KV-cache group, a
	// sliding-window group's clipped to its window (remote.BlockIDs is
	// their concatenation).
	groups    [][]int
	signature string
	// history is the decode's hash chain over the held tokens, one entry
	// per block (the last may cover a partial block); turn-2 prefills only.
	history []string
	// digest is what the signature covers of the tokens: a decode leg's
	// prompt digest (promptDigestParam, as sent), a turn-2 prefill's
	// history chain digest.
	digest string
	// expired, if set, says why genuine params are past their expiry
	// (wrapping kvxfer.ErrSignatureExpired): the KV they name is gone, so
	// nothing is dialed and the load fails at once.
	expired error
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

// parseKV checks parsed kv_transfer_params against a prompt of promptLen
// tokens on an engine with blockSize-token blocks and KV-cache groups of
// windows (engine.Engine.KVGroupWindows), and keeps what the connector
// needs of them. The keys are vLLM's (NIXL connector); unknown
// keys are ignored, as vLLM does. With history, a do_remote_decode request
// may also name a decode's conversation hold (vLLM's bidirectional mode);
// without, those fields are ignored.
func parseKV(kv kvparams.Params, promptLen, blockSize int, windows []int, history bool) (kvRequest, error) {
	var out kvRequest
	switch {
	case kv.DoRemoteDecode && kv.DoRemotePrefill:
		return out, invalid("do_remote_decode and do_remote_prefill are both true: a request is either the prefill leg (do_remote_decode) or the decode leg (do_remote_prefill) of a disaggregated request, not both")
	case kv.DoRemoteDecode:
		out.remoteDecode = true
		if !history || kv.RemoteEngineID == "" {
			return out, nil // turn 1: no conversation to pull
		}
		n := kv.RemoteNumTokens
		if n < 1 {
			return out, invalid("remote_num_tokens must be the number of tokens the decode engine holds, got none")
		}
		if err := parseRemote(kv, &out, n, blockSize, windows); err != nil {
			return out, err
		}
		if want := (n + blockSize - 1) / blockSize; len(kv.History) != want {
			return out, invalid("%s must list one hash per held block (%d), got %d: pass the decode engine's kv_transfer_params verbatim", historyParam, want, len(kv.History))
		}
		for i, h := range kv.History {
			if len(h) != 2*chainHashBytes {
				return out, invalid("%s[%d] is not a block hash", historyParam, i)
			}
		}
		out.history = kv.History
		out.digest = chainDigest(kv.History)
		if e := kv.RemoteBlocksExpiryTime; e > 0 {
			out.remote.Deadline = time.Unix(0, int64(e*1e9))
		}
		return out, nil
	case !kv.DoRemotePrefill:
		return out, nil
	}
	if n := kv.RemoteNumTokens; n != 0 && n != promptLen {
		return out, invalid("remote_num_tokens is %d but the prompt has %d tokens: the decode leg must send the same prompt as the prefill leg", n, promptLen)
	}
	if err := parseRemote(kv, &out, promptLen, blockSize, windows); err != nil {
		return out, err
	}
	if d := kv.PromptDigest; d != "" && len(d) != 2*sha256.Size {
		return out, invalid("%s must be the prefill's digest of the prompt (%d hex digits), got %q: pass the prefill's kv_transfer_params verbatim", promptDigestParam, 2*sha256.Size, d[:min(len(d), 40)])
	}
	out.digest = kv.PromptDigest
	return out, nil
}

// parseRemote checks the remote_* identity, block and signature fields of
// KV covering numTokens tokens and keeps them in out.
func parseRemote(kv kvparams.Params, out *kvRequest, numTokens, blockSize int, windows []int) error {
	var missing []string
	for _, f := range []struct {
		key string
		set bool
	}{
		{"remote_engine_id", kv.RemoteEngineID != ""}, {"remote_request_id", kv.RemoteRequestID != ""},
		{"remote_host", kv.RemoteHost != ""}, {"remote_port", kv.RemotePort != 0}, {"remote_block_ids", kv.RemoteBlockIDs != nil},
	} {
		if !f.set {
			missing = append(missing, f.key)
		}
	}
	if len(missing) > 0 {
		return invalid("kv_transfer_params name remote KV but %s missing: pass the kv_transfer_params of the engine's response verbatim", plural(missing))
	}
	if n := numGroups(windows); len(kv.RemoteBlockIDs) != n {
		return invalid("remote_block_ids has %d KV-cache groups; this engine has %d, so the prefill engine must serve the same model with the same hybrid KV cache setting", len(kv.RemoteBlockIDs), n)
	}
	if kv.TPSize > 1 {
		return invalid("tp_size %d is not supported: Tandem engines run with tensor parallelism 1, so the prefill engine must too", kv.TPSize)
	}
	nb := (numTokens + blockSize - 1) / blockSize
	for g, ids := range kv.RemoteBlockIDs {
		if want := nb - clipStart(window(windows, g), numTokens, blockSize); len(ids) != want {
			where := ""
			if len(kv.RemoteBlockIDs) > 1 {
				where = fmt.Sprintf(" for KV-cache group %d (window %d)", g, window(windows, g))
			}
			return invalid("remote_block_ids lists %d blocks but the %d-token prompt fills %d blocks of %d tokens on this engine%s: send the same prompt as the prefill leg, and start both engines with the same --block-size",
				len(ids), numTokens, want, blockSize, where)
		}
	}
	out.groups = kv.RemoteBlockIDs
	out.remote = &kvxfer.RemoteParams{
		EngineID: kv.RemoteEngineID, RequestID: kv.RemoteRequestID, Host: kv.RemoteHost, Port: kv.RemotePort,
		BlockIDs: flatten(kv.RemoteBlockIDs), Generation: kv.RemoteRegistrationGeneration,
	}
	out.signature = kv.Signature
	out.numTokens = numTokens
	return nil
}

// historyParam carries a decode's hash chain over the conversation it
// holds (kvparams.Params.History).
const historyParam = "tandem_history"

func plural(keys []string) string {
	if len(keys) == 1 {
		return keys[0] + " is"
	}
	return strings.Join(keys, ", ") + " are"
}
