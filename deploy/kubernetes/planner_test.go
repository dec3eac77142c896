package kubernetes

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/kubetest"
)

// TestPlannerScaleComponent builds production with
// components/planner-scale, as its comment says to, applies it, and checks
// what it gives the router: its flags parse, and its account may get and
// update the scale of the two engine Deployments and nothing more than
// before (not the Deployments themselves, not another Deployment's scale).
func TestPlannerScaleComponent(t *testing.T) {
	cp := kubetest.Shared(t)
	root := workTree(t)
	dir := filepath.Join(root, "with-planner-scale")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../overlays/production]\ncomponents: [../components/planner-scale]\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := namespace(t, cp, "planner-scale")
	objects := inNamespace(t, cp, root, "with-planner-scale", ns)
	r := parse(t, objects)
	var ds deploymentSpec
	r.get(t, "Deployment", "tandem-router").decodeSpec(t, &ds)
	c := ds.Template.Spec.Containers[0]
	for _, want := range []string{"--planner-scale", "--slo-ttft=2s", "--slo-tpot=100ms"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("router args %q lack %s", c.Args, want)
		}
	}
	args := make([]string, 0, len(c.Args)+1)
	for _, a := range c.Args {
		args = append(args, r.resolve(t, c, a))
	}
	cmd := exec.CommandContext(t.Context(), tandemBinary(t), append(args, "-h")...)
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tandem %s -h: %v\n%s", strings.Join(args, " "), err, firstLines(string(out), 5))
	}

	if out, err := cp.Kubectl(t.Context(), objects, "apply", "-f", "-"); err != nil {
		t.Fatalf("applying production with planner-scale: %v\n%s", err, out)
	}
	as := "system:serviceaccount:" + ns + ":" + ds.Template.Spec.ServiceAccountName
	for _, tc := range []struct {
		verb, resource string
		want           string
	}{
		{"get", "deployments.apps/tandem-prefill", "no"},
		{"update", "deployments.apps/tandem-decode", "no"},
		{"list", "endpointslices.discovery.k8s.io", "yes"},
		{"list", "pods", "no"},
	} {
		out, _ := cp.Kubectl(t.Context(), nil, "auth", "can-i", tc.verb, tc.resource, "-n", ns, "--as", as)
		if got := lastLine(string(out)); got != tc.want {
			t.Errorf("can %s %s %s? %q, want %q", as, tc.verb, tc.resource, got, tc.want)
		}
	}
	for _, tc := range []struct {
		verb, name string
		want       string
	}{
		{"get", "tandem-prefill", "yes"},
		{"update", "tandem-prefill", "yes"},
		{"update", "tandem-decode", "yes"},
		{"update", "tandem-router", "no"},
		{"patch", "tandem-decode", "no"},
	} {
		out, _ := cp.Kubectl(t.Context(), nil, "auth", "can-i", tc.verb, "deployments.apps/"+tc.name, "--subresource=scale", "-n", ns, "--as", as)
		if got := lastLine(string(out)); got != tc.want {
			t.Errorf("can %s %s the scale of %s? %q, want %q", as, tc.verb, tc.name, got, tc.want)
		}
	}
}
