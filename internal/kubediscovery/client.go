package kubediscovery

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// namespaceFile is where a pod's service account token is mounted with its
// namespace.
const namespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// Namespace returns the namespace of the pod this process runs in (its
// service account's namespace file), or "default" outside a cluster.
func Namespace() string { return namespaceFrom(namespaceFile) }

func namespaceFrom(path string) string {
	if b, err := os.ReadFile(path); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "default"
}

// RESTConfig returns the API client configuration: from the kubeconfig file
// when one is named, else the pod's in-cluster configuration (service
// account token, KUBERNETES_SERVICE_HOST), else the kubeconfig files of
// $KUBECONFIG (else ~/.kube/config) as kubectl reads them.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err == nil {
		return cfg, nil
	}
	if !errors.Is(err, rest.ErrNotInCluster) {
		return nil, fmt.Errorf("in-cluster configuration: %w", err)
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("not in a cluster, and no usable kubeconfig (give --kubeconfig or set $KUBECONFIG): %w", err)
	}
	return cfg, nil
}

// NewClient returns an API client for cfg that identifies itself as
// userAgent and speaks protobuf (smaller and faster to decode than JSON for
// lists and watches).
func NewClient(cfg *rest.Config, userAgent string) (kubernetes.Interface, error) {
	cfg = rest.CopyConfig(cfg)
	if userAgent != "" {
		cfg.UserAgent = userAgent
	}
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	return kubernetes.NewForConfig(cfg)
}
