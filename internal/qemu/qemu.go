// Package qemu runs a package's tests built for arm64 under QEMU's user-mode
// emulator, for tests on an amd64 machine: the arm64 (NEON) kernels and the
// code paths only arm64 builds take are tested in CI that way. The
// emulator comes from scripts/qemu-binary.sh ($TANDEM_QEMU). It emulates a
// Neoverse N1 (Graviton2: ARMv8.2 with ASIMD and the dot product), so the
// kernels use nothing later cores add. Its timings mean nothing: speed is
// the calibration's business on the machine itself.
package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// CPU is the core the emulator presents.
const CPU = "neoverse-n1"

// Dir returns the directory holding qemu-aarch64 ($TANDEM_QEMU), or an
// error saying how to get one.
func Dir() (string, error) {
	d := os.Getenv("TANDEM_QEMU")
	if d == "" {
		return "", errors.New("qemu: TANDEM_QEMU is unset: fetch the emulator by `bash scripts/qemu-binary.sh` and set TANDEM_QEMU to the directory it prints")
	}
	if _, err := os.Stat(filepath.Join(d, "qemu-aarch64")); err != nil {
		return "", fmt.Errorf("qemu: TANDEM_QEMU=%s lacks qemu-aarch64: %w", d, err)
	}
	return d, nil
}

// RunTests builds the tests of the package in the current directory (the
// calling test's) for linux/arm64, runs those matching run (with -short)
// under the emulator in that directory, and fails t unless they pass and each test
// named in want ran and passed (a skip does not count). It returns the
// verbose output. Without the emulator it calls testutil.Missing.
func RunTests(t *testing.T, run string, want ...string) string {
	t.Helper()
	if runtime.GOARCH == "arm64" {
		t.Skip("the tests run natively here")
	}
	dir, err := Dir()
	if err != nil {
		testutil.Missing(t, err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "arm64.test")
	goBin, err := exec.LookPath("go")
	if err != nil {
		testutil.Missing(t, "the go command, to build the tests for arm64")
	}
	build := exec.CommandContext(ctx, goBin, "test", "-c", "-o", bin, ".")
	build.Env = append(os.Environ(), "GOOS=linux", "GOARCH=arm64", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the tests for arm64: %v\n%s", err, out)
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "qemu-aarch64"), "-cpu", CPU, bin,
		"-test.count=1", "-test.short", "-test.v", "-test.run", run)
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	text := out.String()
	if err != nil {
		t.Fatalf("the arm64 tests under qemu (-test.run %q): %v\n%s", run, err, failures(text))
	}
	for _, name := range want {
		if !strings.Contains(text, "--- PASS: "+name+" ") {
			t.Errorf("under qemu, %s did not run and pass:\n%s", name, failures(text))
		}
	}
	return text
}

// failures keeps the lines of a verbose test output worth reading: what
// failed, skipped or was logged, not the runs and passes.
func failures(text string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(text, "\n") {
		l := strings.TrimSpace(line)
		if strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- PASS") {
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}
