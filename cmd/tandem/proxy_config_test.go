package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/proxy"
)

func TestProxyConfigFile(t *testing.T) {
	write := func(t *testing.T, s string) string {
		p := filepath.Join(t.TempDir(), "proxy.yaml")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("settings by flag name, pipelines by pool, and command-line flags win", func(t *testing.T) {
		file := write(t, `
prefill: [127.0.0.1:1, 127.0.0.1:2]
decode: 127.0.0.1:3
policy: prefix
pd-decider: conditional
pd-threshold: 512
max-in-flight: 32
profiles:
  decode:
    filters: [healthy, not-saturated]
    scorers:
      - {name: prefix, weight: 3}
      - {name: load, weight: 1}
    picker: power-of-two
`)
		f, err := parseProxyFlags([]string{"--config", file, "--pd-threshold", "100"})
		if err != nil {
			t.Fatal(err)
		}
		c := f.cfg
		if len(c.Prefill) != 2 || len(c.Decode) != 1 || c.Policy != "prefix" || c.PDDecider != "conditional" || c.Router.MaxInFlight != 32 {
			t.Errorf("config %+v", c)
		}
		if c.Router.Threshold != 100 {
			t.Errorf("pd-threshold %d, want the command line's 100", c.Router.Threshold)
		}
		if c.DecodeProfile == nil || c.DecodeProfile.Picker != "power-of-two" || len(c.DecodeProfile.Scorers) != 2 || c.PrefillProfile != nil {
			t.Errorf("profiles: prefill %+v decode %+v", c.PrefillProfile, c.DecodeProfile)
		}
		if _, err := proxy.New(c); err != nil {
			t.Errorf("proxy.New with the file's config: %v", err)
		}
	})
	for _, tt := range []struct{ name, yaml, want string }{
		{"an unknown setting is refused", "prefill: a:1\ndecode: b:2\nthreshold: 3\n", "unknown setting"},
		{"keys are not read from the file", "prefill: a:1\ndecode: b:2\napi-key: x\n", "cannot be set"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseProxyFlags([]string{"--config", write(t, tt.yaml)})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
	t.Run("an unknown scorer in a profile fails at start", func(t *testing.T) {
		f, err := parseProxyFlags([]string{"--config", write(t, "prefill: a:1\ndecode: b:2\nprofiles:\n  prefill:\n    scorers: [{name: nope, weight: 1}]\n")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := proxy.New(f.cfg); err == nil || !strings.Contains(err.Error(), "nope") {
			t.Errorf("New: %v, want an unknown scorer error", err)
		}
	})
}

// TestProxyWithoutPrefillRunsColocated: `tandem proxy --decode URL` with no
// --prefill is the colocated split under the default decider (every
// decode prefills its own prompts); under --pd-decider always, which sends
// every prompt to a prefill engine, it is refused naming --prefill, and no
// --decode is refused as before.
func TestProxyWithoutPrefillRunsColocated(t *testing.T) {
	f, err := parseProxyFlags([]string{"--decode", "http://b:1,http://c:1"})
	if err != nil || len(f.cfg.Prefill) != 0 || len(f.cfg.Decode) != 2 {
		t.Fatalf("--decode alone: %+v, %v; want two decodes and no prefill engine", f, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--decode", "http://b:1", "--pd-decider", "always"}, "--prefill"},
		{[]string{"--prefill", "http://a:1"}, "--decode"},
	} {
		if _, err := parseProxyFlags(c.args); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want one naming %s", c.args, err, c.want)
		}
	}
}
