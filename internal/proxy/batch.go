package proxy

import (
	"bytes"
	"encoding/json"
	"strings"
)

// reasonBatchPrompt is the disaggregation decision's reason (and the
// X-Tandem-Pd "local; reason=...") of a /v1/completions request whose prompt
// is a batch: kv_transfer_params name the KV of one prompt, so engines
// (Tandem's, vLLM's) refuse them on a batch, and its decode prefills every
// prompt itself. Splitting a batch into one P/D request per prompt would
// also need the answers merged (choice indices, usage, interleaved streams)
// for a kind of request that is rare and, being a batch, latency-tolerant.
const reasonBatchPrompt = "batch_prompt"

// isBatchPrompt reports whether obj, the body of a request to path, is a
// completion of more than one prompt: a prompt that is a list of two or more
// strings or token lists. A list of numbers is one prompt of token ids, and
// a list of one prompt is one prompt.
func isBatchPrompt(path string, obj *object) bool {
	if !strings.HasSuffix(path, "/completions") || strings.HasSuffix(path, "/chat/completions") {
		return false
	}
	raw := bytes.TrimSpace(obj.getFolded("prompt"))
	if len(raw) == 0 || raw[0] != '[' {
		return false
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil || len(items) < 2 {
		return false
	}
	first := bytes.TrimSpace(items[0])
	return len(first) > 0 && (first[0] == '"' || first[0] == '[')
}
