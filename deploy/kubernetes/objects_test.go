package kubernetes

// Rendering the manifests, and the parts of the rendered objects the tests
// read.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/tandem-serve/tandem/internal/kubetest"
)

// ---- rendering ------------------------------------------------------------

// workTree copies this directory's manifests (base, overlays, components,
// tools, testdata) into a temporary directory and writes a secrets.env with fresh
// random keys next to every secrets.env.example, as a user would before
// deploying. A secrets.env of the checkout itself is never read. It returns
// the copy's root.
func workTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, top := range []string{"base", "overlays", "components", "tools", "testdata"} {
		err := filepath.WalkDir(top, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			dst := filepath.Join(root, path)
			if d.IsDir() {
				return os.MkdirAll(dst, 0o755)
			}
			if d.Name() == "secrets.env" {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if err := os.WriteFile(dst, b, 0o644); err != nil {
				return err
			}
			if d.Name() == "secrets.env.example" {
				env := fmt.Sprintf("kv-secret=%s\napi-key=%s\nbackend-api-key=%s\n", randomHex(t), randomHex(t), randomHex(t))
				return os.WriteFile(filepath.Join(filepath.Dir(dst), "secrets.env"), []byte(env), 0o600)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("copying the manifests: %v", err)
		}
	}
	return root
}

func randomHex(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// kustomize renders dir with `kubectl kustomize` (the pinned kubectl's
// built-in kustomize) and returns its standard output.
func kustomize(t *testing.T, cp *kubetest.ControlPlane, dir string) []byte {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), filepath.Join(cp.BinDir, "kubectl"), "kustomize", dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.String())
	}
	return stdout.Bytes()
}

// inNamespace writes a kustomization that puts the overlay at rel (relative
// to root) into namespace ns, and renders it. Kustomize's namespace
// transformer moves every object and the RoleBinding's subject, exactly as
// the overlay's own `namespace: tandem` does.
func inNamespace(t *testing.T, cp *kubetest.ControlPlane, root, rel, ns string) []byte {
	t.Helper()
	dir := filepath.Join(root, "in-"+ns)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: %s\nresources:\n  - ../%s\n", ns, filepath.ToSlash(rel))
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return kustomize(t, cp, dir)
}

var nsCount atomic.Int64

// namespace creates a fresh namespace on the control plane whose Pod
// Security admission enforces, and warns about, the "restricted" profile:
// a Pod that breaks it is refused, and a workload whose pod template breaks
// it draws a warning.
func namespace(t *testing.T, cp *kubetest.ControlPlane, prefix string) string {
	t.Helper()
	ns := fmt.Sprintf("%s-%d-%s", prefix, nsCount.Add(1), randomHex(t)[:6])
	obj := fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %s
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/warn: restricted
`, ns)
	if out, err := cp.Kubectl(t.Context(), []byte(obj), "apply", "-f", "-"); err != nil {
		t.Fatalf("creating namespace %s: %v\n%s", ns, err, out)
	}
	return ns
}

// dryRun sends objects to the API server as `kubectl apply
// --dry-run=server --validate=strict`: admission, defaulting, validation
// and strict field checks all run, and nothing is stored.
func dryRun(t *testing.T, cp *kubetest.ControlPlane, objects []byte) ([]byte, error) {
	t.Helper()
	return cp.Kubectl(t.Context(), objects, "apply", "--dry-run=server", "--validate=strict", "-f", "-")
}

// ---- the rendered objects -------------------------------------------------

type objectMeta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// object is one rendered manifest: the fields the tests read, for every
// kind they look at (the rest of the document is ignored).
type object struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   objectMeta `yaml:"metadata"`
	// ServiceAccount
	AutomountServiceAccountToken *bool `yaml:"automountServiceAccountToken"`
	// Secret, ConfigMap
	Data map[string]string `yaml:"data"`
	// Role, ClusterRole
	Rules []policyRule `yaml:"rules"`
	// RoleBinding, ClusterRoleBinding
	RoleRef  roleRef   `yaml:"roleRef"`
	Subjects []subject `yaml:"subjects"`
	// Everything with a spec, decoded by kind with the accessors below.
	Spec yaml.Node `yaml:"spec"`
}

func (o object) id() string { return o.Kind + "/" + o.Metadata.Name }

func (o object) decodeSpec(t *testing.T, into any) {
	t.Helper()
	if err := o.Spec.Decode(into); err != nil {
		t.Fatalf("%s: spec: %v", o.id(), err)
	}
}

type policyRule struct {
	APIGroups     []string `yaml:"apiGroups"`
	Resources     []string `yaml:"resources"`
	Verbs         []string `yaml:"verbs"`
	ResourceNames []string `yaml:"resourceNames"`
}

type roleRef struct {
	APIGroup string `yaml:"apiGroup"`
	Kind     string `yaml:"kind"`
	Name     string `yaml:"name"`
}

type subject struct {
	Kind      string `yaml:"kind"`
	Name      string `yaml:"name"`
	Namespace string `yaml:"namespace"`
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

// matches reports whether the selector selects a pod with labels (a
// selector without matchLabels selects nothing here: the manifests never
// rely on matchExpressions).
func (s *labelSelector) matches(labels map[string]string) bool {
	if s == nil || len(s.MatchLabels) == 0 {
		return false
	}
	for k, v := range s.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

type deploymentSpec struct {
	Replicas *int          `yaml:"replicas"`
	Selector labelSelector `yaml:"selector"`
	Template struct {
		Metadata objectMeta `yaml:"metadata"`
		Spec     podSpec    `yaml:"spec"`
	} `yaml:"template"`
}

type podSpec struct {
	ServiceAccountName            string              `yaml:"serviceAccountName"`
	AutomountServiceAccountToken  *bool               `yaml:"automountServiceAccountToken"`
	EnableServiceLinks            *bool               `yaml:"enableServiceLinks"`
	TerminationGracePeriodSeconds *int                `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               *podSecurityContext `yaml:"securityContext"`
	Affinity                      *struct {
		PodAntiAffinity *struct {
			Required  []podAffinityTerm `yaml:"requiredDuringSchedulingIgnoredDuringExecution"`
			Preferred []struct {
				Weight int             `yaml:"weight"`
				Term   podAffinityTerm `yaml:"podAffinityTerm"`
			} `yaml:"preferredDuringSchedulingIgnoredDuringExecution"`
		} `yaml:"podAntiAffinity"`
	} `yaml:"affinity"`
	Containers []container `yaml:"containers"`
	Volumes    []volume    `yaml:"volumes"`
}

type podAffinityTerm struct {
	TopologyKey   string         `yaml:"topologyKey"`
	LabelSelector *labelSelector `yaml:"labelSelector"`
}

type podSecurityContext struct {
	RunAsNonRoot   *bool `yaml:"runAsNonRoot"`
	RunAsUser      *int  `yaml:"runAsUser"`
	SeccompProfile *struct {
		Type string `yaml:"type"`
	} `yaml:"seccompProfile"`
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []envVar `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	StartupProbe   *probe `yaml:"startupProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	Lifecycle      *struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
			Exec *struct {
				Command []string `yaml:"command"`
			} `yaml:"exec"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	SecurityContext *struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		Capabilities             *struct {
			Drop []string `yaml:"drop"`
			Add  []string `yaml:"add"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		FieldRef *struct {
			FieldPath string `yaml:"fieldPath"`
		} `yaml:"fieldRef"`
		ResourceFieldRef *struct {
			ContainerName string `yaml:"containerName"`
			Resource      string `yaml:"resource"`
			Divisor       string `yaml:"divisor"`
		} `yaml:"resourceFieldRef"`
		SecretKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
		ConfigMapKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"configMapKeyRef"`
	} `yaml:"valueFrom"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
	TCPSocket *struct {
		Port any `yaml:"port"`
	} `yaml:"tcpSocket"`
	InitialDelaySeconds int `yaml:"initialDelaySeconds"`
	PeriodSeconds       int `yaml:"periodSeconds"`
	FailureThreshold    int `yaml:"failureThreshold"`
}

type volume struct {
	Name                  string    `yaml:"name"`
	EmptyDir              *struct{} `yaml:"emptyDir"`
	PersistentVolumeClaim *struct {
		ClaimName string `yaml:"claimName"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"persistentVolumeClaim"`
}

type serviceSpec struct {
	ClusterIP string            `yaml:"clusterIP"`
	Selector  map[string]string `yaml:"selector"`
	Ports     []struct {
		Name       string `yaml:"name"`
		Port       int    `yaml:"port"`
		TargetPort any    `yaml:"targetPort"`
	} `yaml:"ports"`
}

type pdbSpec struct {
	MinAvailable   any           `yaml:"minAvailable"`
	MaxUnavailable any           `yaml:"maxUnavailable"`
	Selector       labelSelector `yaml:"selector"`
}

type networkPolicySpec struct {
	PodSelector labelSelector `yaml:"podSelector"`
	PolicyTypes []string      `yaml:"policyTypes"`
	Ingress     []struct {
		From []struct {
			PodSelector       *labelSelector `yaml:"podSelector"`
			NamespaceSelector *labelSelector `yaml:"namespaceSelector"`
		} `yaml:"from"`
		Ports []struct {
			Port any `yaml:"port"`
		} `yaml:"ports"`
	} `yaml:"ingress"`
}

// rendered is an overlay's objects.
type rendered struct {
	objects []object
}

func parse(t *testing.T, b []byte) *rendered {
	t.Helper()
	r := &rendered{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("parsing the rendered manifests: %v", err)
		}
		if o.Kind == "" {
			continue
		}
		r.objects = append(r.objects, o)
	}
	return r
}

func (r *rendered) ofKind(kind string) []object {
	var out []object
	for _, o := range r.objects {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

func (r *rendered) get(t *testing.T, kind, name string) object {
	t.Helper()
	for _, o := range r.objects {
		if o.Kind == kind && o.Metadata.Name == name {
			return o
		}
	}
	t.Fatalf("no %s %q in the rendered manifests", kind, name)
	return object{}
}

func (r *rendered) deployment(t *testing.T, name string) deploymentSpec {
	t.Helper()
	var d deploymentSpec
	r.get(t, "Deployment", name).decodeSpec(t, &d)
	return d
}

// ---- container helpers ----------------------------------------------------

func (c container) env(name string) (envVar, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e, true
		}
	}
	return envVar{}, false
}

// flag returns the value of --name=value in c's args, as written.
func (c container) flag(name string) (string, bool) {
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func (c container) port(name string) int {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// resolve expands $(VAR) in s the way the kubelet does for args, from c's
// env: literal values, resource limits (resourceFieldRef), ConfigMap keys
// of r, and for the downward API's pod fields a stand-in value. Secret
// values never reach args.
func (r *rendered) resolve(t *testing.T, c container, s string) string {
	t.Helper()
	return varRef.ReplaceAllStringFunc(s, func(ref string) string {
		name := varRef.FindStringSubmatch(ref)[1]
		e, ok := c.env(name)
		if !ok {
			t.Errorf("container %s: $(%s) in its args is not in its env (the kubelet would pass it on verbatim)", c.Name, name)
			return ref
		}
		switch v := e.ValueFrom; {
		case v == nil:
			return e.Value
		case v.FieldRef != nil:
			return map[string]string{"status.podIP": "10.1.2.3", "metadata.namespace": "tandem", "metadata.name": "pod-0"}[v.FieldRef.FieldPath]
		case v.ResourceFieldRef != nil:
			return strconv.Itoa(cpuCount(t, c.Resources.Limits["cpu"]))
		case v.ConfigMapKeyRef != nil:
			return r.get(t, "ConfigMap", v.ConfigMapKeyRef.Name).Data[v.ConfigMapKeyRef.Key]
		}
		t.Errorf("container %s: $(%s) comes from a Secret: keys must not be on the command line", c.Name, name)
		return ref
	})
}

// resolvedFlag is flag name's value with $(VAR) expanded.
func (r *rendered) resolvedFlag(t *testing.T, c container, name string) (string, bool) {
	v, ok := c.flag(name)
	if !ok {
		return "", false
	}
	return r.resolve(t, c, v), true
}

// cpuCount parses a whole CPU quantity ("2"); a fraction fails the test, as
// --threads could then not match the CPUs the pod gets.
func cpuCount(t *testing.T, q string) int {
	t.Helper()
	n, err := strconv.Atoi(q)
	if err != nil || n <= 0 {
		t.Errorf("CPU limit %q: want a whole number of CPUs, so that --threads and a static CPU manager agree with it", q)
		return 1
	}
	return n
}

// quantityBytes parses a Kubernetes memory quantity (512Mi, 4Gi, 1G, bytes).
func quantityBytes(t *testing.T, q string) int64 {
	t.Helper()
	units := []struct {
		suffix string
		mult   int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}}
	for _, u := range units {
		if n, ok := strings.CutSuffix(q, u.suffix); ok {
			v, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				t.Fatalf("memory quantity %q: %v", q, err)
			}
			return v * u.mult
		}
	}
	v, err := strconv.ParseInt(q, 10, 64)
	if err != nil {
		t.Fatalf("memory quantity %q: %v", q, err)
	}
	return v
}

// tandemBytes parses a size as tandem's byte-size flags take it (64MiB,
// 1GiB, 512MB).
func tandemBytes(t *testing.T, s string) int64 {
	t.Helper()
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseFloat(n, 64)
			if err != nil {
				t.Fatalf("size %q: %v", s, err)
			}
			return int64(v * u.mult)
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("size %q: %v", s, err)
	}
	return v
}

func isTrue(b *bool) bool  { return b != nil && *b }
func isFalse(b *bool) bool { return b != nil && !*b }
