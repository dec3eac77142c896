//go:build !arm64

package model

import (
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/qemu"
)

// TestARM64UnderQEMU runs the forward pass's tests against references we
// did not write (transformers' logits, the golden greedy ids) and its batch
// invariance, built for arm64 under QEMU (a Neoverse N1), with the kernel
// set an arm64 CPU starts with.
func TestARM64UnderQEMU(t *testing.T) {
	if testing.Short() {
		t.Skip("runs tests in an emulator")
	}
	want := []string{"TestStories260KGreedyMatchesGolden", "TestMatchesTransformers", "TestForwardIsBatchInvariant",
		"TestGGUFStoriesF32MatchesGolden", "TestBF16ModelsNearReference"}
	qemu.RunTests(t, "^("+strings.Join(want, "|")+")$", want...)
}
