package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/defaultmodel"
	"github.com/tandem-serve/tandem/internal/testutil"
)

func TestServeFallsBackToTheDefaultModel(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		install bool // whether the default model is used
	}{
		{"no --model uses the default model", []string{"--port", "0"}, true},
		{"no flags at all uses the default model", nil, true},
		{"--model DIR is kept", []string{"--model", "m", "--port", "0"}, false},
		{"-model=DIR is kept", []string{"-model=m"}, false},
		{"a value that looks like --model is not one", []string{"--engine-id", "--model"}, true},
		{"flags that do not parse are left for serve to report", []string{"--no-such-flag"}, false},
		{"-h is left for serve", []string{"-h"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cache := t.TempDir()
			t.Setenv("XDG_CACHE_HOME", cache)
			var out bytes.Buffer
			got, err := withDefaultModel(tt.args, &out)
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(cache, "tandem", "models", defaultmodel.Name)
			want := tt.args
			if tt.install {
				want = append([]string{"--model", dir}, tt.args...)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("args (-want +got):\n%s", diff)
			}
			if installed := defaultmodel.Verify(dir) == nil; installed != tt.install {
				t.Errorf("default model installed: %v, want %v", installed, tt.install)
			}
			if printed := out.String() == defaultmodel.Describe(dir)+"\n"; printed != tt.install {
				t.Errorf("printed %q, want the description: %v", out.String(), tt.install)
			}
			if tt.install {
				c, err := parseServeFlags(got)
				if err != nil {
					t.Fatal(err)
				}
				if c.ServedModelName != defaultmodel.Name {
					t.Errorf("served model name %q, want %q", c.ServedModelName, defaultmodel.Name)
				}
			}
		})
	}
}

// captureStdout runs f with os.Stdout redirected and returns what it wrote.
func captureStdout(t *testing.T, f func() error) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	err = f()
	os.Stdout = saved
	w.Close()
	out := <-done
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func TestGenerateWithoutModelTellsTheGoldenStory(t *testing.T) {
	g := testutil.StoriesGolden(t)
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	out := captureStdout(t, func() error {
		return runGenerate([]string{"--prompt", "Once upon a time", "--max-tokens", "16", "--threads", "1"})
	})
	story := "Once upon a time" + strings.TrimSuffix(out, "\n")
	if len(story) < len("Once upon a time, there was") || !strings.HasPrefix(g.GreedyText, story) {
		t.Errorf("generate printed %q; want the start of the golden text %q", out, g.GreedyText)
	}
}

func TestModelInspectWithoutDirShowsTheDefaultModelAndItsLicense(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	out := captureStdout(t, func() error { return runModelInspect(nil) })
	dir := filepath.Join(cache, "tandem", "models", defaultmodel.Name)
	for _, want := range []string{defaultmodel.Describe(dir), "parameters:", "license:         " + filepath.Join(dir, defaultmodel.NoticeFile)} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
}
