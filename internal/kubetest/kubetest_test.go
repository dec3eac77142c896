package kubetest_test

import (
	"os"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

func endpointSlice(name, addr string) []byte {
	return []byte(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: ` + name + `
  namespace: kubetest
  labels:
    kubernetes.io/service-name: decode
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: 8000
endpoints:
- addresses: ["` + addr + `"]
  conditions:
    ready: true
`)
}

func TestControlPlane(t *testing.T) {
	cp := kubetest.Shared(t)
	ctx := t.Context()
	kubectl := func(stdin []byte, args ...string) string {
		t.Helper()
		out, err := cp.Kubectl(ctx, stdin, args...)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}

	out := kubectl(nil, "version")
	for _, want := range []string{"Client Version: " + kubetest.KubernetesVersion, "Server Version: " + kubetest.KubernetesVersion} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl version: no %q in\n%s", want, out)
		}
	}
	if kubectl(nil, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}") != "admin" {
		t.Errorf("kubectl auth whoami: not admin")
	}

	// apply, not create: the control plane is shared by every run in the
	// test binary (-count=N), and a second create fails AlreadyExists.
	kubectl([]byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: kubetest}\n"), "apply", "-f", "-")
	kubectl(endpointSlice("decode-a", "198.18.0.10"), "apply", "-f", "-")
	got := kubectl(nil, "-n", "kubetest", "get", "endpointslice", "decode-a",
		"-o", "jsonpath={.endpoints[0].addresses[0]} {.endpoints[0].conditions.ready} {.metadata.labels.kubernetes\\.io/service-name}")
	if got != "198.18.0.10 true decode" {
		t.Errorf("EndpointSlice read back as %q", got)
	}

	// The API server refuses loopback endpoint addresses, which is why the
	// end-to-end tests give engines addresses of their own.
	out2, err := cp.Kubectl(ctx, endpointSlice("decode-loop", "127.0.0.1"), "apply", "-f", "-")
	if err == nil {
		t.Fatalf("a loopback EndpointSlice address was accepted:\n%s", out2)
	}
	if !strings.Contains(string(out2), "loopback") {
		t.Errorf("loopback address refused for another reason:\n%s", out2)
	}
}

// RBAC is enforced for identities other than the admin: a service account
// may do only what a RoleBinding grants it.
func TestRBAC(t *testing.T) {
	cp := kubetest.Shared(t)
	ctx := t.Context()
	apply := func(y string) {
		t.Helper()
		if _, err := cp.Kubectl(ctx, []byte(y), "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
	}
	apply(`apiVersion: v1
kind: Namespace
metadata: {name: kubetest-rbac}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: router, namespace: kubetest-rbac}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: endpointslice-reader, namespace: kubetest-rbac}
rules:
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: router, namespace: kubetest-rbac}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: endpointslice-reader}
subjects:
- {kind: ServiceAccount, name: router, namespace: kubetest-rbac}
`)
	as := "--as=system:serviceaccount:kubetest-rbac:router"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"watch", "endpointslices.discovery.k8s.io"}, "yes"},
		{[]string{"list", "endpointslices.discovery.k8s.io"}, "yes"},
		{[]string{"create", "endpointslices.discovery.k8s.io"}, "no"},
		{[]string{"list", "pods"}, "no"},
		{[]string{"list", "endpointslices.discovery.k8s.io", "-n", "default"}, "no"},
	} {
		args := append([]string{"auth", "can-i", "-n", "kubetest-rbac", as}, c.args...)
		out, _ := cp.Kubectl(ctx, nil, args...) // "no" exits 1
		if got := strings.TrimSpace(string(out)); got != c.want {
			t.Errorf("kubectl %s: %q, want %q", strings.Join(args, " "), got, c.want)
		}
	}

	// A token the API server signs for the service account authenticates.
	tok, err := cp.Kubectl(ctx, nil, "-n", "kubetest-rbac", "create", "token", "router")
	if err != nil {
		t.Fatal(err)
	}
	out, err := cp.Kubectl(ctx, nil, "--token="+strings.TrimSpace(string(tok)), "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}")
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != "system:serviceaccount:kubetest-rbac:router" {
		t.Errorf("service-account token authenticates as %q", out)
	}
}
