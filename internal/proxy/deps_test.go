package proxy

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/openai"
)

func TestReleasePathIsTheEngines(t *testing.T) {
	if kvReleasePath != openai.KVReleasePath {
		t.Errorf("kvReleasePath = %q, engines serve %q", kvReleasePath, openai.KVReleasePath)
	}
}

// TestRouterDoesNotLinkTheEngine keeps the router's binary free of the
// inference engine: the proxy needs the error shape (package apierror), not
// the engine behind package openai. Nor does it link client-go: Kubernetes
// discovery (package kubediscovery) feeds it through the Backends
// interface, wired in cmd/tandem.
func TestRouterDoesNotLinkTheEngine(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "k8s.io/") || strings.HasSuffix(dep, "/internal/kubediscovery") {
			t.Errorf("package proxy links %s", dep)
		}
		for _, banned := range []string{"/internal/engine", "/internal/openai", "/internal/model", "/internal/sched", "/internal/tensor"} {
			if strings.HasSuffix(dep, banned) {
				t.Errorf("package proxy links %s", dep)
			}
		}
	}
}
