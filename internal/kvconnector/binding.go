package kvconnector

import (
	"errors"

	"github.com/tandem-serve/tandem/internal/kvparams"
)

// A prefill's params name blocks of one prompt's KV. A decode leg that
// pulled them for another prompt of the same length would publish that KV
// under its own prompt's block hashes in its prefix cache, and answer every
// later request extending its prompt from the wrong KV (prefix-cache
// poisoning). So the params carry a digest of the prompt's tokens, covered
// by the signature, and a decode refuses them unless its own prompt has
// the same digest — before it dials or allocates anything.

// promptDigestParam carries the digest of the prompt whose KV a prefill's
// params name (kvparams.PromptDigest).
const promptDigestParam = "tandem_prompt_digest"

// errOtherPrompt is a decode leg whose params were issued for another
// prompt.
var errOtherPrompt = errors.New("the params were issued for another prompt (its " + promptDigestParam + " differs from this prompt's)")

// bindPrompt checks that a decode leg's params name the KV of prompt:
// their digest must be this prompt's. Params without one are refused too
// (every Tandem prefill sends it, and proxies pass params verbatim).
func (c *Connector) bindPrompt(k kvRequest, prompt []int32) error {
	switch {
	case k.digest == "":
		return errors.New("kv_transfer_params carry no " + promptDigestParam)
	case k.digest != kvparams.PromptDigest(c.cfg.ModelFingerprint, prompt):
		return errOtherPrompt
	}
	return nil
}
