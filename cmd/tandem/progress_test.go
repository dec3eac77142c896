package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/progress"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/testmodels"
)

// runTandem runs this test binary as the tandem command with args, its
// stdout and stderr pipes (so not terminals), and returns both.
func runTandem(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), actAsTandem+"=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("tandem %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, out.String(), errOut.String())
	}
	return out.String(), errOut.String()
}

// captureOutput runs f with os.Stdout and os.Stderr redirected to pipes and
// returns what each got and f's error.
func captureOutput(t *testing.T, f func() error) (stdout, stderr string, err error) {
	t.Helper()
	read := func(p **os.File) (restore func() string) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		saved := *p
		*p = w
		done := make(chan []byte)
		go func() {
			b, _ := io.ReadAll(r)
			done <- b
		}()
		return func() string {
			*p = saved
			w.Close()
			return string(<-done)
		}
	}
	restoreOut, restoreErr := read(&os.Stdout), read(&os.Stderr)
	err = f()
	stdout, stderr = restoreOut(), restoreErr()
	return stdout, stderr, err
}

// levelLine is the final progress line of a benchmark level.
const levelLine = `(?m)^.+ round \d+/\d+: \d+/\d+ requests(, \d+ failed)? in `

// checkPlain fails unless stderr has every line pattern in want, in plain
// lines (no carriage returns or escape sequences off a terminal), and
// stdout none of them.
func checkPlain(t *testing.T, stdout, stderr string, want ...string) {
	t.Helper()
	for _, w := range want {
		re := regexp.MustCompile(w)
		if !re.MatchString(stderr) {
			t.Errorf("stderr lacks a line matching %q:\n%s", w, stderr)
		}
		if re.MatchString(stdout) {
			t.Errorf("stdout has progress (%q):\n%s", w, stdout)
		}
	}
	if strings.ContainsAny(stderr, "\r\x1b") {
		t.Errorf("stderr, not a terminal, has carriage returns or escapes: %q", stderr)
	}
}

func TestModelInitShowsProgressOnStderr(t *testing.T) {
	t.Run("a checkpoint directory", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "m")
		stdout, stderr := runTandem(t, "model", "init", "--shape", "tiny", "--out", dir)
		if !regexp.MustCompile(`^wrote tiny \(bf16, .* parameters, .* of weights\) to .*\n$`).MatchString(stdout) {
			t.Errorf("stdout is not the one result line: %q", stdout)
		}
		checkPlain(t, stdout, stderr, `(?m)^writing tiny \(bf16\): [0-9.]+ [KM]iB in [0-9.]+s`)
	})
	t.Run("a GGUF file", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "m.gguf")
		stdout, stderr := runTandem(t, "model", "init", "--shape", "tiny", "--dtype", "q8_0", "--out", out)
		if !regexp.MustCompile(`^wrote tiny \(q8_0, .*\n$`).MatchString(stdout) {
			t.Errorf("stdout is not the one result line: %q", stdout)
		}
		checkPlain(t, stdout, stderr, `(?m)^writing tiny \(bf16\): `, `(?m)^reading tiny: `,
			`(?m)^quantizing to q8_0: [0-9.]+ [KM]iB, ([0-9]+)/[0-9]+ tensors in `)
	})
}

func TestModelQuantizeShowsProgressOnStderr(t *testing.T) {
	src := testmodels.Stories260K(t)
	out := filepath.Join(t.TempDir(), "s.gguf")
	stdout, stderr := runTandem(t, "model", "quantize", src, "--type", "q8_0", "--out", out)
	if !strings.HasPrefix(stdout, "wrote "+out) || strings.Count(stdout, "\n") != 1 {
		t.Errorf("stdout is not the one result line: %q", stdout)
	}
	checkPlain(t, stdout, stderr, `(?m)^reading hf: 1020\.6 KiB in `, `(?m)^quantizing to q8_0: [0-9.]+ KiB, 47/47 tensors in `)

	t.Run("--quiet shows none", func(t *testing.T) {
		stdout, stderr := runTandem(t, "model", "quantize", src, "--type", "q8_0", "--out", out, "--quiet")
		if stderr != "" || !strings.HasPrefix(stdout, "wrote ") {
			t.Errorf("stdout %q, stderr %q: want the result and no progress", stdout, stderr)
		}
	})
}

func TestModelLoadShowsTheBytesRead(t *testing.T) {
	src := testmodels.Stories260K(t)
	var out bytes.Buffer
	pool := tensor.NewPool(1)
	defer pool.Close()
	m, err := loadModel(src, pool, progress.NewWriter(&out, progress.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if !regexp.MustCompile(`^loading hf: 1020\.6 KiB in [0-9.]+s`).MatchString(out.String()) {
		t.Errorf("load progress %q, want the final line of the bytes read", out.String())
	}
}

func TestBenchShowsProgressOnStderr(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	stdout, stderr := runTandem(t, "bench", "--target", "t="+srv.URL, "--model", "m", "--vocab", "100", "--requests", "4",
		"--max-tokens", "2", "--rates", "100,200")
	checkPlain(t, stdout, stderr, `(?m)^t rate 100 round 1/1: 4/4 requests in `, `(?m)^t rate 200 round 1/1: 4/4 requests in `)
	if !strings.Contains(stdout, "rate 200") {
		t.Errorf("stdout lacks the results table:\n%s", stdout)
	}
}

func TestServeReportsTheModelLoadUnlessQuiet(t *testing.T) {
	dir := testmodels.Stories260K(t)
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"--progress", "plain"}, true},
		{[]string{"--quiet"}, false},
		{[]string{"--progress=never"}, false},
	} {
		f, err := parseServeFlags(append([]string{"--model", dir}, tc.args...))
		if err != nil {
			t.Fatal(err)
		}
		if got := f.LoadProgress != nil; got != tc.want {
			t.Errorf("serve %v: load progress %v, want %v", tc.args, got, tc.want)
		}
	}
}
