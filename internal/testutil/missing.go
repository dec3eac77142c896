package testutil

import (
	"os"
	"testing"
)

// Missing ends a test that cannot run here for want of what (a binary, a
// Python module, network namespaces): it skips the test, or fails it under
// TANDEM_REQUIRE_TESTDATA=1, as CI runs, so that a missing dependency
// never passes there as a skip. Package testmodels, which testutil
// imports, has its own copy for the test models.
func Missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("TANDEM_REQUIRE_TESTDATA") == "1" {
		t.Fatalf("test data missing: %s (TANDEM_REQUIRE_TESTDATA=1)", what)
	}
	t.Skipf("test data missing: %s", what)
}
