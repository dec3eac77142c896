// Package vllmtest starts a real vLLM engine for tests: `vllm serve` from the
// virtual environment scripts/vllm/install.sh builds (vLLM's CPU build),
// waits for its /health, and stops it when the test ends.
//
// The environment is found through TANDEM_VLLM_ENV, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/tandem/vllm-env. Without one, Require
// skips the test, or fails it under TANDEM_REQUIRE_VLLM=1. CI does not set
// that variable: the interop tests run wherever vLLM is installed and say
// why they skip elsewhere; the conformance tests that check recorded
// payloads (testdata/vllm) need no vLLM at all.
package vllmtest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// Env is an installed vLLM environment.
type Env struct {
	// Dir is the virtual environment's root.
	Dir string
}

// Python is the environment's interpreter.
func (e Env) Python() string { return filepath.Join(e.Dir, "bin", "python") }

// VLLM is the environment's vllm command.
func (e Env) VLLM() string { return filepath.Join(e.Dir, "bin", "vllm") }

// EnvDir is where the environment is looked for: TANDEM_VLLM_ENV, else
// tandem/vllm-env under the user cache directory (as install.sh puts it).
func EnvDir() string {
	if d := os.Getenv("TANDEM_VLLM_ENV"); d != "" {
		return d
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "tandem", "vllm-env")
}

// Find returns the environment at EnvDir, or an error that says how to
// install one.
func Find() (Env, error) {
	dir := EnvDir()
	if dir == "" {
		return Env{}, errors.New("vllmtest: no home or cache directory: set TANDEM_VLLM_ENV to the environment scripts/vllm/install.sh built")
	}
	e := Env{Dir: dir}
	for _, p := range []string{e.Python(), e.VLLM(), filepath.Join(dir, ".tandem-requirements.sha256")} {
		if _, err := os.Stat(p); err != nil {
			return Env{}, fmt.Errorf("vllmtest: no complete vLLM environment at %s (%w): run bash scripts/vllm/install.sh, or set TANDEM_VLLM_ENV", dir, err)
		}
	}
	return e, nil
}

// Require returns the environment, or skips t without one; under
// TANDEM_REQUIRE_VLLM=1 it fails t instead.
func Require(t testing.TB) Env {
	t.Helper()
	e, err := Find()
	if err != nil {
		if requireVLLM() {
			t.Fatalf("%v (TANDEM_REQUIRE_VLLM=1)", err)
		}
		t.Skip(err)
	}
	return e
}

// CPUEnv is the environment vLLM's CPU backend needs here: the CPU platform
// chosen explicitly (the torch PyPI serves is a CUDA build), a KV pool of
// kvGiB, and no thread pinning (the cores are shared with other processes).
func CPUEnv(kvGiB int) []string {
	return []string{
		"VLLM_TARGET_DEVICE=cpu",
		"VLLM_CPU_KVCACHE_SPACE=" + strconv.Itoa(kvGiB),
		"VLLM_CPU_OMP_THREADS_BIND=nobind",
		"VLLM_NO_USAGE_STATS=1",
		"DO_NOT_TRACK=1",
	}
}

// requireVLLM reports TANDEM_REQUIRE_VLLM=1: a missing environment (or a
// part of it a test needs) fails the test instead of skipping it.
func requireVLLM() bool { return os.Getenv("TANDEM_REQUIRE_VLLM") == "1" }
