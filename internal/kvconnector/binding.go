package kvconnector

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
)

// A prefill's params name blocks of one prompt's KV. A decode leg that
// pulled them for another prompt of the same length would publish that KV
// under its own prompt's block hashes in its prefix cache, and answer every
// later request extending its prompt from the wrong KV (prefix-cache
// poisoning). So the params carry a digest of the prompt's tokens, covered
// by the signature, and a decode refuses them unless its own prompt has
// the same digest — before it dials or allocates anything.

// promptDigestParam carries the digest of the prompt whose KV a prefill's
// params name.
const promptDigestParam = "tandem_prompt_digest"

// promptDigest is the digest of prompt's tokens, keyed by the model: the
// hex SHA-256 of a label, the model fingerprint and the tokens.
func promptDigest(model string, prompt []int32) string {
	h := sha256.New()
	h.Write([]byte("tandem kv prompt\x00" + model + "\x00"))
	buf := make([]byte, 0, 4*min(len(prompt), 4096))
	for start := 0; start < len(prompt); start += 4096 {
		buf = buf[:0]
		for _, t := range prompt[start:min(start+4096, len(prompt))] {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
		}
		h.Write(buf)
	}
	return hex.EncodeToString(h.Sum(nil))
}

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
	case k.digest != promptDigest(c.cfg.ModelFingerprint, prompt):
		return errOtherPrompt
	}
	return nil
}
