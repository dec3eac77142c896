package tensor

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// The calibration cache: one small JSON file per CPU model and build under
// the user cache directory, so that a restart on the same kind of machine
// skips the measurement and, more importantly, chooses as before. A file
// read is touched; storing one removes those unused for cacheMaxAge and
// all but the cacheMaxFiles most recently used, so that upgrades do not
// pile up files of builds that will never run again.

// calibrationVersion changes when the workloads or the decision change, so
// that older results are measured again.
const calibrationVersion = 3

// The cache's bounds: files unused this long, or beyond this many, go.
const (
	cacheMaxAge   = 30 * 24 * time.Hour
	cacheMaxFiles = 32
)

// cachedCalibration is a cache file's content.
type cachedCalibration struct {
	Version int
	Key     string
	Calibration
}

// cacheKey identifies what a calibration depends on: the CPU model
// (cpuIdentity), the kernels this process can run and the build.
func cacheKey(buildID string) string {
	return fmt.Sprintf("v%d|%s|%s/%s|sets=%v|quant=%v|build=%s", calibrationVersion, cpuIdentity(),
		runtime.GOOS, runtime.GOARCH, ISAs(), availQuantNames(), buildID)
}

// cpuIdentity names the CPU model: vendor, family, model, stepping,
// microcode and model name from /proc/cpuinfo where there is one (Linux),
// otherwise the architecture only.
func cpuIdentity() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	return cpuIdentityFrom(string(b))
}

// cpuIdentityFrom extracts cpuIdentity's fields from the first processor
// of a /proc/cpuinfo text.
func cpuIdentityFrom(cpuinfo string) string {
	want := []string{"vendor_id", "cpu family", "model", "stepping", "microcode", "model name"}
	got := map[string]string{}
	for line := range strings.SplitSeq(cpuinfo, "\n") {
		if strings.TrimSpace(line) == "" && len(got) > 0 {
			break // the end of the first processor
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			got[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	parts := make([]string, 0, len(want))
	for _, k := range want {
		parts = append(parts, k+"="+got[k])
	}
	return strings.Join(parts, ",")
}

// cachePath is the file for key under dir.
func cachePath(dir, key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(dir, "kernels-"+hex.EncodeToString(sum[:8])+".json")
}

// loadCalibration returns the calibration cached for key, if any.
func loadCalibration(dir, key string) (Calibration, bool) {
	b, err := os.ReadFile(cachePath(dir, key))
	if err != nil {
		return Calibration{}, false
	}
	var c cachedCalibration
	if json.Unmarshal(b, &c) != nil || c.Version != calibrationVersion || c.Key != key {
		return Calibration{}, false
	}
	now := time.Now()
	_ = os.Chtimes(cachePath(dir, key), now, now) // used: keep it
	return c.Calibration, true
}

// storeCalibration caches c for key, best effort: a cache that cannot be
// written only means the next start measures again.
func storeCalibration(dir, key string, c Calibration) {
	b, err := json.MarshalIndent(cachedCalibration{Version: calibrationVersion, Key: key, Calibration: c}, "", "  ")
	if err != nil || os.MkdirAll(dir, 0o755) != nil {
		return
	}
	path := cachePath(dir, key)
	tmp, err := os.CreateTemp(dir, ".kernels-*")
	if err != nil {
		return
	}
	_, werr := tmp.Write(b)
	if cerr := tmp.Close(); werr != nil || cerr != nil || os.Rename(tmp.Name(), path) != nil {
		_ = os.Remove(tmp.Name())
		return
	}
	pruneCalibrations(dir, path, time.Now())
}

// pruneCalibrations removes the cache files under dir other than keep
// that were last used before now-cacheMaxAge or are not among the
// cacheMaxFiles most recently used, best effort.
func pruneCalibrations(dir, keep string, now time.Time) {
	paths, _ := filepath.Glob(filepath.Join(dir, "kernels-*.json"))
	type file struct {
		path string
		used time.Time
	}
	var files []file
	for _, p := range paths {
		if p == keep {
			continue
		}
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			files = append(files, file{p, st.ModTime()})
		}
	}
	slices.SortFunc(files, func(a, b file) int { return b.used.Compare(a.used) })
	for i, f := range files {
		if i+1 >= cacheMaxFiles || now.Sub(f.used) > cacheMaxAge {
			_ = os.Remove(f.path)
		}
	}
}
