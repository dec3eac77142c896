package kubetest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// startTimeout bounds the start of the shared control plane.
const startTimeout = 90 * time.Second

var shared struct {
	mainRan bool // set by Main before m.Run

	once sync.Once
	cp   *ControlPlane
	dir  string
	// missing is BinDir's error: the binaries are not there.
	missing error
	// err is Start's error.
	err error
}

// Main runs the tests of a package that uses Shared and returns the exit code
// for os.Exit; it stops the shared control plane, if one was started, and
// removes its directory. Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }
func Main(m *testing.M) int {
	shared.mainRan = true
	code := m.Run()
	if shared.cp != nil {
		shared.cp.Stop()
	}
	if shared.dir != "" {
		if err := os.RemoveAll(shared.dir); err != nil {
			fmt.Fprintf(os.Stderr, "kubetest: removing %s: %v\n", shared.dir, err)
		}
	}
	return code
}

// Shared returns the test binary's one control plane, started on first use
// and reused by every later caller; Main stops it. Where the binaries are
// missing it skips the test, naming scripts/kube-binaries.sh, or fails it
// when TANDEM_REQUIRE_TESTDATA=1. A start that failed fails every caller.
// Tests sharing it should keep to their own namespaces.
func Shared(t testing.TB) *ControlPlane {
	t.Helper()
	if !shared.mainRan {
		t.Fatal("kubetest.Shared needs the package's TestMain to call kubetest.Main (it stops the control plane and removes its directory)")
	}
	shared.once.Do(func() {
		bin, err := BinDir()
		if err != nil {
			shared.missing = err
			return
		}
		shared.dir, err = os.MkdirTemp("", "tandem-kube-")
		if err != nil {
			shared.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		begin := time.Now()
		shared.cp, shared.err = Start(ctx, bin, shared.dir)
		if shared.err == nil {
			t.Logf("kubetest: control plane at %s ready in %.1f s (%s)", shared.cp.URL, time.Since(begin).Seconds(), shared.dir)
		}
	})
	if shared.missing != nil {
		testutil.Missing(t, shared.missing.Error())
	}
	if shared.err != nil {
		t.Fatalf("shared control plane: %v", shared.err)
	}
	return shared.cp
}
