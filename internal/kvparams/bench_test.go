package kvparams

import (
	"fmt"
	"testing"
)

// typical is what a prefill answers for a 2,048-token prompt on a model
// with one full-attention group and one sliding-window group (16-token
// blocks): 128 and 32 block ids, a signed digest, no history.
func typical() Params {
	ids := [][]int{make([]int, 128), make([]int, 32)}
	for g := range ids {
		for i := range ids[g] {
			ids[g][i] = 1000 + 131*i + g
		}
	}
	return Params{
		DoRemotePrefill: true, RemoteEngineID: "prefill-0-9f1c2b7a", RemoteBlockIDs: ids, RemoteHost: "10.0.3.17",
		RemotePort: 5600, RemoteRequestID: "cmpl-3b1f6c2e8d9a4f70a1b2c3d4e5f60718", RemoteNumTokens: 2048, TPSize: 1,
		TransferMode: "pull", RemoteRegistrationGeneration: 3,
		PromptDigest: "7c4a8d09ca3762af61e59520943dc26494f8941b7c4a8d09ca3762af61e59520",
		Signature:    "v1.1733390000." + fmt.Sprintf("%064x", 12345),
	}
}

// BenchmarkParse is a decode engine reading a prefill's params (and the
// proxy reading the prefill's answer): Parse, and the general path alone
// (what every field took before the fast path).
func BenchmarkParse(b *testing.B) {
	raw := typical().Raw()
	for _, fast := range []bool{true, false} {
		b.Run(map[bool]string{true: "fast", false: "general"}[fast], func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parse(raw, fast); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMarshal is a prefill engine writing its params: MarshalJSON,
// and every value through json.Marshal (what it did before the fast path).
func BenchmarkMarshal(b *testing.B) {
	p := typical()
	for _, fast := range []bool{true, false} {
		b.Run(map[bool]string{true: "fast", false: "general"}[fast], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.marshal(fast); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
