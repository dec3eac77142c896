package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/kubediscovery"
	"github.com/tandem-serve/tandem/internal/proxy"
)

func TestProxyDiscoveryFlags(t *testing.T) {
	t.Run("kubernetes discovery by Service names needs no static list", func(t *testing.T) {
		f, err := parseProxyFlags([]string{"--discovery", "kubernetes", "--prefill-service", "tp", "--decode-service", "td", "--kube-namespace", "llm"})
		if err != nil {
			t.Fatal(err)
		}
		if !f.cfg.DynamicBackends || len(f.cfg.Prefill) != 0 || f.kube.namespace != "llm" {
			t.Errorf("cfg %+v kube %+v", f.cfg, f.kube)
		}
		pools, err := f.kube.pools()
		if err != nil {
			t.Fatal(err)
		}
		want := []kubediscovery.Pool{
			{Role: "prefill", Selector: "kubernetes.io/service-name=tp", PortName: "http"},
			{Role: "decode", Selector: "kubernetes.io/service-name=td", PortName: "http"},
		}
		if diff := cmp.Diff(want, pools); diff != "" {
			t.Errorf("pools (-want +got):\n%s", diff)
		}
		if _, err := proxy.New(f.cfg); err != nil {
			t.Errorf("proxy.New with empty pools under discovery: %v", err)
		}
	})
	t.Run("selectors, a port name, and static seeds", func(t *testing.T) {
		f, err := parseProxyFlags([]string{"--discovery", "kubernetes", "--prefill-selector", "app=tandem,role=prefill", "--decode-selector", "role in (decode)",
			"--kube-port-name", "api", "--prefill", "10.0.0.1:8000", "--decode", "10.0.0.2:8000"})
		if err != nil {
			t.Fatal(err)
		}
		pools, _ := f.kube.pools()
		if pools[0].Selector != "app=tandem,role=prefill" || pools[1].Selector != "role in (decode)" || pools[1].PortName != "api" {
			t.Errorf("pools %+v", pools)
		}
		if len(f.cfg.Prefill) != 1 || len(f.cfg.Decode) != 1 {
			t.Errorf("static seeds lost: %+v", f.cfg)
		}
	})
	t.Run("from the YAML config", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "proxy.yaml")
		if err := os.WriteFile(p, []byte("discovery: kubernetes\nprefill-service: tp\ndecode-service: td\nkube-port-name: \"-\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := parseProxyFlags([]string{"--config", p})
		if err != nil {
			t.Fatal(err)
		}
		if pools, _ := f.kube.pools(); len(pools) != 2 || pools[0].PortName != kubediscovery.UnnamedPort {
			t.Errorf("pools %+v", pools)
		}
	})
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"a Service flag without kubernetes discovery", []string{"--prefill", "a:1", "--decode", "b:2", "--prefill-service", "x"}, "--prefill-service needs --discovery kubernetes"},
		{"a kubeconfig without kubernetes discovery", []string{"--prefill", "a:1", "--decode", "b:2", "--kubeconfig", "k"}, "--kubeconfig needs --discovery kubernetes"},
		{"a role without a Service or selector", []string{"--discovery", "kubernetes", "--prefill-service", "x"}, "--decode-service NAME or --decode-selector"},
		{"a Service and a selector for one role", []string{"--discovery", "kubernetes", "--prefill-service", "x", "--prefill-selector", "a=b", "--decode-service", "y"}, "not both"},
		{"kubernetes and a backends file", []string{"--discovery", "kubernetes", "--prefill-service", "x", "--decode-service", "y", "--backends-file", "f"}, "choose one"},
		{"an unknown discovery", []string{"--discovery", "consul"}, "want static or kubernetes"},
		{"static with no engines", nil, "--discovery kubernetes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseProxyFlags(tt.args)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}
