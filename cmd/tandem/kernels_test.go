package main

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/tensor"
)

// TestCalibrateKernelsLogsTheChoice: serve's start-up names the kernels it
// chose and why, here forced through TANDEM_KERNELS.
func TestCalibrateKernelsLogsTheChoice(t *testing.T) {
	def := tensor.ISA()
	t.Cleanup(func() { _ = tensor.SetISA(def) })
	want := tensor.ISAs()[len(tensor.ISAs())-1]
	t.Setenv(tensor.KernelsEnv, want)
	var buf bytes.Buffer
	c, err := calibrateKernels(slog.New(slog.NewTextHandler(&buf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	line := buf.String()
	if c.Set != want || tensor.ISA() != want || !strings.Contains(line, "CPU kernels chosen") ||
		!strings.Contains(line, "kernels="+want) || !strings.Contains(line, "source=override") || !strings.Contains(line, "TANDEM_KERNELS="+want) {
		t.Fatalf("chose %s (active %s), logged %q; want %s from the override, logged with its reason", c.Set, tensor.ISA(), line, want)
	}
	t.Setenv(tensor.KernelsEnv, "sse9")
	if _, err := calibrateKernels(slog.New(slog.NewTextHandler(&buf, nil))); err == nil || !strings.Contains(err.Error(), "TANDEM_KERNELS") {
		t.Fatalf("an unknown TANDEM_KERNELS: %v", err)
	}
}
