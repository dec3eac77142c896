// Package kubetest runs a real Kubernetes control plane (etcd and
// kube-apiserver, no controllers, no nodes) for tests, and the real kubectl
// against it.
//
// The binaries are built at pinned versions by scripts/kube-binaries.sh, which
// caches them under ${XDG_CACHE_HOME:-$HOME/.cache}/tandem/kube/; CI exports
// their directory as $TANDEM_KUBE_BIN. A package that needs the control plane
// starts one per test binary:
//
//	func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		cp := kubetest.Shared(t)
//		out, err := cp.Kubectl(t.Context(), nil, "get", "namespaces")
//		...
//	}
//
// Where the binaries are missing, Shared skips the test with the script's
// name, or fails it when TANDEM_REQUIRE_TESTDATA=1 (as CI sets).
//
// The API server authenticates one admin user (group system:masters) by a
// static bearer token, authorizes with RBAC (so Roles and RoleBindings mean
// what they mean in a cluster, for any other identity), serves TLS with a
// certificate from a CA the package generates, and signs service-account
// tokens with a key it generates. With no controller manager, nothing
// reconciles: Deployments get no ReplicaSets, namespaces get no default
// ServiceAccount (the ServiceAccount admission plugin is disabled so that pods
// can still be created), and EndpointSlices are exactly what a test writes.
package kubetest
