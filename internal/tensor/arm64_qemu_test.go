//go:build !arm64

package tensor

import (
	"testing"

	"github.com/tandem-serve/tandem/internal/qemu"
)

// TestARM64UnderQEMU runs this package's tests built for arm64 under QEMU
// (a Neoverse N1): the "neon" set's kernels against their definition and
// every property the package's tests hold each set to (batch invariance,
// the value sums' and arg max's equality to their Go loops, the
// calibration), the "neondot" quantized kernels bit for bit against the
// others, and the code only arm64 builds take.
func TestARM64UnderQEMU(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the package's tests in an emulator (two minutes)")
	}
	qemu.RunTests(t, "", "TestNEONDotKernelsMatchTheirDefinition", "TestMatMulIsBatchInvariant",
		"TestAxpyRowsBF16GroupMatchesSeparateCalls", "TestArgMaxMatchesPlainLoop", "TestQuantizeRowsGolden",
		"TestQuantKernelsAgreeBitForBit",
		"TestAssemblySetsHaveAttentionScanKernels")
}
