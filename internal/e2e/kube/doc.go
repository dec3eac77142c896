// Package kube holds the end-to-end test of Tandem on Kubernetes discovery:
// real `tandem serve` engines, each in a network namespace of its own with a
// non-loopback address (internal/testhosts), stand for pods on separate
// nodes; a real kube-apiserver (internal/kubetest) holds the EndpointSlices
// that name them; a real `tandem proxy --discovery kubernetes` watches those
// slices and routes to the engines, whose KV pulls cross a real interface.
// The test changes the slices as Kubernetes would while pods scale, turn
// unready and drain, under a bounded load, and counts lost requests.
//
// It needs root (network namespaces) and the control-plane binaries of
// scripts/kube-binaries.sh; without them it skips, or fails under
// TANDEM_REQUIRE_TESTDATA=1.
package kube
