package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// PythonCandidates are the Pythons PyZMQ tries, in order: TANDEM_PYTHON
// (set by .ci/run), the environment scripts/python-test-env.sh builds
// under the user cache, then python3 on PATH.
func PythonCandidates() []string {
	var c []string
	if py := os.Getenv("TANDEM_PYTHON"); py != "" {
		c = append(c, py)
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		if home, err := os.UserHomeDir(); err == nil {
			cache = filepath.Join(home, ".cache")
		}
	}
	if cache != "" {
		c = append(c, filepath.Join(cache, "tandem", "pyenv", "bin", "python"))
	}
	return append(c, "python3")
}

// PyZMQ returns a Python that imports pyzmq and msgpack (the real libzmq
// vLLM talks through), or skips the test without one — fails it under
// TANDEM_REQUIRE_TESTDATA=1, as CI runs, where scripts/python-test-env.sh
// has built one.
func PyZMQ(t testing.TB) string {
	t.Helper()
	tried := PythonCandidates()
	for _, py := range tried {
		if err := exec.Command(py, "-c", "import zmq, msgpack").Run(); err == nil {
			return py
		}
	}
	msg := fmt.Sprintf("no Python with pyzmq and msgpack (tried %s): run bash scripts/python-test-env.sh, or set TANDEM_PYTHON", strings.Join(tried, ", "))
	Missing(t, msg)
	return ""
}
