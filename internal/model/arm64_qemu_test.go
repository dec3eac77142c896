//go:build !arm64

package model

import (
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/qemu"
)

// TestARM64UnderQEMU runs the forward pass's tests against references we
// did not write (transformers' logits, the golden greedy ids), its batch
// invariance and the quantized models' (Q8_0, Q4_K_M) closeness to their
// f32 twins, built for arm64 under QEMU (a Neoverse N1), with the kernels
// an arm64 CPU starts with.
func TestARM64UnderQEMU(t *testing.T) {
	if testing.Short() {
		t.Skip("runs tests in an emulator")
	}
	want := []string{"TestStories260KGreedyMatchesGolden", "TestMatchesTransformers", "TestForwardIsBatchInvariant",
		"TestGGUFStoriesF32MatchesGolden", "TestBF16ModelsNearReference", "TestGGUFStoriesQ8_0NearF32", "TestGGUFQ4KMMix",
		"TestGGUFQuantizedNearTwins"}
	qemu.RunTests(t, "^("+strings.Join(want, "|")+")$", want...)
}
