package tensor

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
)

// KernelsEnv is the environment variable that overrides the calibration
// (see CalibrateConfig.Override): for tests, experts and clusters whose
// prefill and decode machines must use one kernel set.
const KernelsEnv = "TANDEM_KERNELS"

// EnvCalibrateConfig is the configuration a Tandem command calibrates
// with: the override from KernelsEnv, the cache under the user cache
// directory (none if there is no such directory) and this executable's
// build.
func EnvCalibrateConfig() CalibrateConfig {
	c := CalibrateConfig{Override: os.Getenv(KernelsEnv), BuildID: buildID()}
	if dir, err := os.UserCacheDir(); err == nil {
		c.CacheDir = filepath.Join(dir, "tandem")
	}
	return c
}

// buildID identifies this executable: the Go version, module version and
// VCS revision, plus the executable's size and time when the tree was
// modified or carries no revision (a development build).
func buildID() string {
	var parts []string
	exact := false
	if bi, ok := debug.ReadBuildInfo(); ok {
		parts = append(parts, bi.GoVersion, bi.Main.Version)
		modified := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				parts = append(parts, s.Value)
				exact = true
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		exact = exact && !modified
	}
	if !exact {
		if exe, err := os.Executable(); err == nil {
			if st, err := os.Stat(exe); err == nil {
				parts = append(parts, fmt.Sprintf("%d@%d", st.Size(), st.ModTime().UnixNano()))
			}
		}
	}
	return strings.Join(parts, ",")
}
