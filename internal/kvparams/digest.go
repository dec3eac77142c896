package kvparams

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// PromptDigest is the value of Params.PromptDigest for a prompt of the
// model with fingerprint model: the hex SHA-256 of "tandem kv prompt\0",
// the fingerprint, "\0" and the token ids as little-endian uint32s. It
// binds a prefill's params to the tokens whose KV they name.
func PromptDigest(model string, prompt []int32) string {
	const chunk = 4096
	h := sha256.New()
	h.Write([]byte("tandem kv prompt\x00" + model + "\x00"))
	buf := make([]byte, 0, 4*min(len(prompt), chunk))
	for start := 0; start < len(prompt); start += chunk {
		buf = buf[:0]
		for _, t := range prompt[start:min(start+chunk, len(prompt))] {
			buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
		}
		h.Write(buf)
	}
	return hex.EncodeToString(h.Sum(nil))
}
