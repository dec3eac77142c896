package kubediscovery

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// deployment is an engine Deployment of n replicas (no controller runs in
// the test control plane, so no pod starts).
func deployment(name string, n int32) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(n),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "tandem"}}},
			},
		},
	}
}

// routerClient is a client acting as the service account router of k's
// namespace (the admin impersonates it), so RBAC applies.
func routerClient(t *testing.T, k *kube) kubernetes.Interface {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", k.cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	rc.Impersonate.UserName = "system:serviceaccount:" + k.ns + ":router"
	c, err := NewClient(rc, "scaler-test")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (k *kube) replicas(t *testing.T, name string) int32 {
	t.Helper()
	d, err := k.client.AppsV1().Deployments(k.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return *d.Spec.Replicas
}

// TestScalerFollowsThePlanner scales the two Deployments as a planner
// would, with the router's account bound to the planner-scale component's
// Role (deploy/kubernetes): their replicas follow.
func TestScalerFollowsThePlanner(t *testing.T) {
	k := newKube(t)
	ctx := t.Context()
	for _, d := range []*appsv1.Deployment{deployment("tandem-prefill", 1), deployment("tandem-decode", 3)} {
		if _, err := k.client.AppsV1().Deployments(k.ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rbac, err := os.ReadFile("../../deploy/kubernetes/components/planner-scale/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The component binds the account tandem-router; here it is router.
	y := strings.ReplaceAll(string(rbac), "name: tandem-router\n", "name: router\n")
	if out, err := k.cp.Kubectl(ctx, []byte(y), "apply", "-n", k.ns, "-f", "-"); err != nil {
		t.Fatalf("applying the component's RBAC: %v\n%s", err, out)
	}
	s, err := NewScaler(ScalerConfig{Client: routerClient(t, k), Namespace: k.ns, Prefill: "tandem-prefill", Decode: "tandem-decode", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct{ p, d int32 }{{2, 2}, {3, 1}, {1, 3}} {
		if err := s.Scale(ctx, int(step.p), int(step.d)); err != nil {
			t.Fatalf("scale to %d+%d: %v", step.p, step.d, err)
		}
		if p, d := k.replicas(t, "tandem-prefill"), k.replicas(t, "tandem-decode"); p != step.p || d != step.d {
			t.Fatalf("replicas %d prefill + %d decode, want %d + %d", p, d, step.p, step.d)
		}
	}
	if s.Publishing() {
		t.Fatal("the scaler says it only publishes, with the RBAC it needs")
	}
}

// TestScalerWithoutRBACOnlyPublishes: an account bound to nothing is
// refused; the scaler says so once in the log, touches nothing and only
// publishes from then on.
func TestScalerWithoutRBACOnlyPublishes(t *testing.T) {
	k := newKube(t)
	ctx := t.Context()
	for _, d := range []*appsv1.Deployment{deployment("tandem-prefill", 1), deployment("tandem-decode", 3)} {
		if _, err := k.client.AppsV1().Deployments(k.ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	s, err := NewScaler(ScalerConfig{Client: routerClient(t, k), Namespace: k.ns, Prefill: "tandem-prefill", Decode: "tandem-decode",
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := s.Scale(ctx, 2, 2); err != nil {
			t.Fatalf("a refused scale is not an error: %v", err)
		}
	}
	if !s.Publishing() {
		t.Fatal("refused, the scaler does not say it only publishes")
	}
	if n := strings.Count(logs.String(), "not allowed to scale"); n != 1 {
		t.Fatalf("said %d times, want once:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "deployments/scale") {
		t.Fatalf("the log does not say what to grant:\n%s", logs.String())
	}
	if p, d := k.replicas(t, "tandem-prefill"), k.replicas(t, "tandem-decode"); p != 1 || d != 3 {
		t.Fatalf("replicas changed to %d + %d without RBAC", p, d)
	}
	if got := testutil.ToFloat64(s.mode.WithLabelValues("publish")); got != 1 {
		t.Fatalf("tandem:planner_scale_mode{mode=publish} = %v, want 1", got)
	}
}
