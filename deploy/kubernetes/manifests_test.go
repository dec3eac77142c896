// Package kubernetes holds Tandem's Kubernetes manifests (a kustomize base
// and overlays) and their tests. The tests render every overlay with the
// kustomize built into the pinned kubectl, send the result to a real
// kube-apiserver as a server-side dry run with strict field validation
// (internal/kubetest), and check the rendered objects for what the
// deployment relies on: probes, the pod IP as --kv-host, grace periods
// longer than the drain, RBAC limited to watching EndpointSlices, and so on.
package kubernetes

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tandem-serve/tandem/internal/kubetest"
	"github.com/tandem-serve/tandem/internal/testutil"
)

func TestMain(m *testing.M) {
	code := kubetest.Main(m)
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// built is the tandem binary, built once per test binary by tandemBinary.
var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// tandemBinary builds ./cmd/tandem (once) and returns its path.
func tandemBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "tandem-manifests-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "tandem")
		out, err := exec.Command("go", "build", "-o", built.bin, "github.com/tandem-serve/tandem/cmd/tandem").CombinedOutput()
		if err != nil {
			built.err = fmt.Errorf("go build ./cmd/tandem: %w\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// overlays are the deployable overlays, by directory under overlays/.
var overlays = []string{"single-node", "production"}

// Drain timings of the binary (cmd/tandem) the grace periods must cover.
const (
	// defaultShutdownTimeout and defaultKVLease are the flags' defaults.
	defaultShutdownTimeout = 30 * time.Second
	defaultKVLease         = 30 * time.Second
	// engineHTTPGrace is how long a draining engine gives handlers to write
	// their last bytes after the engine stopped (drain.go's httpGrace).
	engineHTTPGrace = 5 * time.Second
	// proxyShutdownGrace is how long `tandem proxy` lets open requests
	// finish after SIGTERM (internal/proxy's shutdownGrace).
	proxyShutdownGrace = 10 * time.Second
	// graceMargin is what a grace period must leave beyond all that.
	graceMargin = 5 * time.Second
)

// ---- tests ------------------------------------------------------------------

// TestOverlaysPassServerDryRun renders every overlay and sends it to the
// real API server as a server-side dry run with strict field validation, in
// a namespace that enforces the "restricted" Pod Security profile: every
// object is accepted, with no warning (no unknown or deprecated field, no
// pod template that breaks the profile), and nothing is stored.
func TestOverlaysPassServerDryRun(t *testing.T) {
	cp := kubetest.Shared(t)
	root := workTree(t)
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			t.Parallel()
			r := parse(t, kustomize(t, cp, filepath.Join(root, "overlays", overlay)))
			for _, o := range r.objects {
				if o.Metadata.Namespace != "tandem" {
					t.Errorf("%s is in namespace %q, want tandem (the overlay's namespace)", o.id(), o.Metadata.Namespace)
				}
			}
			ns := namespace(t, cp, "dry-"+overlay)
			objects := inNamespace(t, cp, root, "overlays/"+overlay, ns)
			out, err := dryRun(t, cp, objects)
			if err != nil {
				t.Fatalf("the API server refused the %s overlay: %v", overlay, err)
			}
			t.Logf("%s", out)
			if n, want := strings.Count(string(out), "(server dry run)"), len(r.objects); n != want {
				t.Errorf("%d objects accepted, want %d", n, want)
			}
			for line := range strings.SplitSeq(string(out), "\n") {
				if strings.HasPrefix(line, "Warning:") {
					t.Errorf("API server warning: %s", line)
				}
			}
			left, err := cp.Kubectl(t.Context(), nil, "get", "deployments,services,secrets,roles", "-n", ns, "-o", "name")
			if err != nil {
				t.Fatal(err)
			}
			if s := strings.TrimSpace(string(left)); s != "" && !strings.Contains(s, "No resources found") {
				t.Errorf("the dry run stored objects: %s", s)
			}
		})
	}
}

// TestBrokenOverlaysAreRefused dry-runs the fixtures under testdata: each
// renders (kustomize checks no schema), and the API server refuses each
// with the message that names the mistake.
func TestBrokenOverlaysAreRefused(t *testing.T) {
	cp := kubetest.Shared(t)
	root := workTree(t)
	for _, tc := range []struct {
		fixture string
		want    string
	}{
		{"unknown-field", `unknown field "spec.template.spec.terminationGracePeriod"`},
		{"removed-apiversion", `no matches for kind "PodDisruptionBudget" in version "policy/v1beta1"`},
		{"pdb-both-set", "minAvailable and maxUnavailable cannot be both set"},
		{"grace-below-prestop", "less than terminationGracePeriodSeconds"},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			t.Parallel()
			kustomize(t, cp, filepath.Join(root, "testdata", tc.fixture)) // renders
			ns := namespace(t, cp, "broken")
			out, err := dryRun(t, cp, inNamespace(t, cp, root, "testdata/"+tc.fixture, ns))
			if err == nil {
				t.Fatalf("the API server accepted the %s fixture:\n%s", tc.fixture, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("refused, but without %q:\n%s", tc.want, out)
			}
			t.Logf("refused as expected: %s", firstLineWith(string(out), tc.want))
		})
	}
}

func firstLineWith(s, sub string) string {
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// TestModelLoaderPod dry-runs tools/model-loader.yaml, a Pod, where the
// "restricted" Pod Security profile is enforced (for Pods it refuses, not
// warns), and checks it mounts the production overlay's model claim
// writable.
func TestModelLoaderPod(t *testing.T) {
	cp := kubetest.Shared(t)
	b, err := os.ReadFile("tools/model-loader.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ns := namespace(t, cp, "loader")
	out, err := cp.Kubectl(t.Context(), b, "apply", "--dry-run=server", "--validate=strict", "-n", ns, "-f", "-")
	if err != nil {
		t.Fatalf("the API server refused the model loader: %v", err)
	}
	if strings.Contains(string(out), "Warning:") {
		t.Errorf("warnings:\n%s", out)
	}
	pod := parse(t, b).get(t, "Pod", "tandem-model-loader")
	var spec podSpec
	pod.decodeSpec(t, &spec)
	prod := parse(t, kustomize(t, cp, filepath.Join(workTree(t), "overlays", "production")))
	pvc := prod.ofKind("PersistentVolumeClaim")
	if len(pvc) != 1 {
		t.Fatalf("production: %d PersistentVolumeClaims, want 1 (the model)", len(pvc))
	}
	found := false
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == pvc[0].Metadata.Name && !v.PersistentVolumeClaim.ReadOnly {
			found = true
		}
	}
	if !found {
		t.Errorf("the loader does not mount claim %s read-write", pvc[0].Metadata.Name)
	}
}

// TestModelImageComponent builds production with components/model-image
// (the model from an image volume instead of the claim), as its comment
// says to, and dry-runs it: the API server accepts the image volumes, no
// claim is left, and every pod that reads the model reads it from the
// image.
func TestModelImageComponent(t *testing.T) {
	cp := kubetest.Shared(t)
	root := workTree(t)
	dir := filepath.Join(root, "with-model-image")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../overlays/production]\ncomponents: [../components/model-image]\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := namespace(t, cp, "model-image")
	objects := inNamespace(t, cp, root, "with-model-image", ns)
	out, err := dryRun(t, cp, objects)
	if err != nil {
		t.Fatalf("the API server refused production with the model image: %v", err)
	}
	if strings.Contains(string(out), "Warning:") {
		t.Errorf("warnings:\n%s", out)
	}
	r := parse(t, objects)
	if n := len(r.ofKind("PersistentVolumeClaim")); n != 0 {
		t.Errorf("%d PersistentVolumeClaims left", n)
	}
	for _, name := range []string{"tandem-prefill", "tandem-decode", "tandem-router"} {
		var raw struct {
			Template struct {
				Spec struct {
					Volumes []struct {
						Name  string `yaml:"name"`
						Image *struct {
							Reference string `yaml:"reference"`
						} `yaml:"image"`
						PersistentVolumeClaim any `yaml:"persistentVolumeClaim"`
					} `yaml:"volumes"`
				} `yaml:"spec"`
			} `yaml:"template"`
		}
		r.get(t, "Deployment", name).decodeSpec(t, &raw)
		found := false
		for _, v := range raw.Template.Spec.Volumes {
			if v.Name == "model" {
				found = v.Image != nil && v.Image.Reference != "" && v.PersistentVolumeClaim == nil
			}
		}
		if !found {
			t.Errorf("%s: volume model is not an image volume alone", name)
		}
	}
}

// TestEngines checks the prefill and decode Deployments of every overlay.
func TestEngines(t *testing.T) {
	cp := kubetest.Shared(t)
	root := workTree(t)
	for _, overlay := range overlays {
		r := parse(t, kustomize(t, cp, filepath.Join(root, "overlays", overlay)))
		for _, role := range []string{"prefill", "decode"} {
			t.Run(overlay+"/"+role, func(t *testing.T) {
				checkEngine(t, r, overlay, role)
			})
		}
	}
}

func checkEngine(t *testing.T, r *rendered, overlay, role string) {
	name := "tandem-" + role
	d := r.deployment(t, name)
	pod := d.Template.Spec
	labels := d.Template.Metadata.Labels
	if labels["tandem.dev/role"] != role || labels["app.kubernetes.io/name"] != "tandem" {
		t.Errorf("pod labels %v: want app.kubernetes.io/name=tandem and tandem.dev/role=%s", labels, role)
	}
	if !d.Selector.matches(labels) || d.Selector.MatchLabels["tandem.dev/role"] != role {
		t.Errorf("selector %v does not select by role %s", d.Selector.MatchLabels, role)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("args %q: want tandem serve", c.Args)
	}
	if v, _ := c.flag("role"); v != role {
		t.Errorf("--role=%q, want %s", v, role)
	}
	if v, _ := c.flag("host"); v != "0.0.0.0" {
		t.Errorf("--host=%q: the API must listen on the pod's addresses (probes, router), want 0.0.0.0", v)
	}
	httpPort := c.port("http")
	if v, _ := c.flag("port"); v != strconv.Itoa(httpPort) || httpPort == 0 {
		t.Errorf("--port=%q, container port http %d", v, httpPort)
	}

	// --kv-host from the pod IP (downward API), on the declared kv port.
	kvHost, _ := c.flag("kv-host")
	m := varRef.FindStringSubmatch(kvHost)
	if m == nil || m[0] != kvHost {
		t.Errorf("--kv-host=%q: want $(VAR) of the pod IP", kvHost)
	} else if e, _ := c.env(m[1]); e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("--kv-host=%s: %s is not the downward API's status.podIP", kvHost, m[1])
	}
	if v, _ := c.flag("kv-port"); v != strconv.Itoa(c.port("kv")) || c.port("kv") == 0 {
		t.Errorf("--kv-port=%q, container port kv %d", v, c.port("kv"))
	}

	// CPU: requests == limits, whole CPUs, and --threads (and GOMAXPROCS)
	// the limit, from the downward API so that a resized overlay follows.
	req, lim := c.Resources.Requests, c.Resources.Limits
	if req["cpu"] == "" || req["cpu"] != lim["cpu"] {
		t.Errorf("cpu requests %q, limits %q: want equal (one compute thread per CPU the pod is given)", req["cpu"], lim["cpu"])
	}
	if req["memory"] == "" || req["memory"] != lim["memory"] {
		t.Errorf("memory requests %q, limits %q: want equal (Guaranteed QoS, no eviction under pressure before best-effort pods)", req["memory"], lim["memory"])
	}
	cpus := cpuCount(t, lim["cpu"])
	threads, _ := c.flag("threads")
	refs := map[string]string{"--threads": "", "GOMAXPROCS": "GOMAXPROCS"}
	if m := varRef.FindStringSubmatch(threads); m != nil && m[0] == threads {
		refs["--threads"] = m[1]
	} else {
		t.Errorf("--threads=%q: want $(VAR) of limits.cpu", threads)
	}
	for what, ref := range refs {
		e, _ := c.env(ref)
		rf := e.ValueFrom
		if rf == nil || rf.ResourceFieldRef == nil || rf.ResourceFieldRef.Resource != "limits.cpu" || rf.ResourceFieldRef.ContainerName != c.Name ||
			(rf.ResourceFieldRef.Divisor != "" && rf.ResourceFieldRef.Divisor != "1") {
			t.Errorf("%s: want the resourceFieldRef limits.cpu of container %s, divisor 1", what, c.Name)
		}
	}
	if th, _ := r.resolvedFlag(t, c, "threads"); th != strconv.Itoa(cpus) {
		t.Errorf("--threads resolves to %q, want %d", th, cpus)
	}

	// The KV cache fits the memory limit with room for weights.
	kvMem, ok := r.resolvedFlag(t, c, "kv-cache-memory")
	if !ok {
		t.Errorf("no --kv-cache-memory: the default is sized from the node's RAM, not the container's limit")
	} else if kv, limit := tandemBytes(t, kvMem), quantityBytes(t, lim["memory"]); kv*2 > limit {
		t.Errorf("--kv-cache-memory=%s is more than half the memory limit %s", kvMem, lim["memory"])
	}

	// Probes: readiness on /health (the listener opens once the model is
	// loaded; 503 while draining), liveness on /livez (200 while draining),
	// a startup probe that allows a slow model load.
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" || fmt.Sprint(p.HTTPGet.Port) != "http" {
		t.Errorf("readinessProbe: want GET /health on port http")
	}
	if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/livez" || fmt.Sprint(p.HTTPGet.Port) != "http" {
		t.Errorf("livenessProbe: want GET /livez on port http (stays 200 while draining)")
	}
	if p := c.StartupProbe; p == nil || p.HTTPGet == nil {
		t.Errorf("no HTTP startupProbe: liveness would restart an engine still loading its model")
	} else if budget := time.Duration(p.InitialDelaySeconds+p.PeriodSeconds*p.FailureThreshold) * time.Second; budget < 10*time.Minute {
		t.Errorf("startupProbe allows %v for the model to load, want ≥ 10m", budget)
	}

	// The grace period covers preStop + the whole drain.
	checkGrace(t, pod, c, func(name string, def time.Duration) time.Duration {
		v, ok := r.resolvedFlag(t, c, name)
		if !ok {
			return def
		}
		dur, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("--%s=%q: %v", name, v, err)
		}
		return dur
	})

	// Prometheus scrape annotations name the HTTP port.
	checkScrape(t, d.Template.Metadata.Annotations, httpPort)

	// No API access: an account without a token.
	if !isFalse(pod.AutomountServiceAccountToken) {
		t.Errorf("automountServiceAccountToken is not false: an engine needs no API token")
	}
	sa := r.get(t, "ServiceAccount", pod.ServiceAccountName)
	if !isFalse(sa.AutomountServiceAccountToken) {
		t.Errorf("ServiceAccount %s: automountServiceAccountToken is not false", sa.Metadata.Name)
	}
	for _, b := range r.ofKind("RoleBinding") {
		for _, s := range b.Subjects {
			if s.Kind == "ServiceAccount" && s.Name == sa.Metadata.Name {
				t.Errorf("RoleBinding %s grants the engines' account %s something", b.Metadata.Name, s.Name)
			}
		}
	}
	checkHardened(t, pod)
	checkSecretRefs(t, r, c)
	if v, ok := c.env("TANDEM_KV_SECRET"); !ok || v.ValueFrom == nil || v.ValueFrom.SecretKeyRef == nil {
		t.Errorf("TANDEM_KV_SECRET does not come from a Secret")
	}

	// Anti-affinity: required one-per-node in production, none on one
	// node (the pods must fit together).
	aa := pod.Affinity
	switch overlay {
	case "single-node":
		if aa != nil {
			t.Errorf("single-node: affinity is set; every pod must fit the one node")
		}
	case "production":
		ok := false
		if aa != nil && aa.PodAntiAffinity != nil {
			for _, term := range aa.PodAntiAffinity.Required {
				if term.TopologyKey == "kubernetes.io/hostname" && term.LabelSelector.matches(labels) && term.LabelSelector.MatchLabels["tandem.dev/role"] == role {
					ok = true
				}
			}
		}
		if !ok {
			t.Errorf("production: no required anti-affinity that keeps two %s engines off one node", role)
		}
	}

	// The model: production reads a Hugging Face directory from a
	// read-only ReadOnlyMany claim; single-node serves the built-in model,
	// which is written to a writable cache.
	switch overlay {
	case "single-node":
		if _, ok := c.flag("model"); ok {
			t.Errorf("single-node: --model set; it serves the built-in model")
		}
		cache, _ := c.env("XDG_CACHE_HOME")
		if !writableEmptyDir(pod, c, cache.Value) {
			t.Errorf("XDG_CACHE_HOME=%q is not on a writable emptyDir (the root filesystem is read-only)", cache.Value)
		}
	case "production":
		model, ok := r.resolvedFlag(t, c, "model")
		if !ok {
			t.Fatalf("production: no --model")
		}
		checkModelVolume(t, r, pod, c, model)
	}

	// A Service selects exactly this pool, with the port the router uses.
	svc := r.get(t, "Service", name)
	var ss serviceSpec
	svc.decodeSpec(t, &ss)
	sel := labelSelector{MatchLabels: ss.Selector}
	if !sel.matches(labels) {
		t.Errorf("Service %s does not select the %s pods", name, role)
	}
	for _, other := range []string{"prefill", "decode", "router"} {
		if other == role {
			continue
		}
		od := r.deployment(t, "tandem-"+other)
		if sel.matches(od.Template.Metadata.Labels) {
			t.Errorf("Service %s also selects the %s pods", name, other)
		}
	}
}

// checkGrace checks terminationGracePeriodSeconds against what the engine
// may take after its container is asked to stop: the preStop sleep, then
// the drain (drain.go: requests in flight get --shutdown-timeout; an engine
// that serves KV keeps it up to --kv-lease after the signal), then
// httpGrace, plus a margin.
func checkGrace(t *testing.T, pod podSpec, c container, dur func(string, time.Duration) time.Duration) {
	t.Helper()
	if pod.TerminationGracePeriodSeconds == nil {
		t.Fatalf("no terminationGracePeriodSeconds")
	}
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	preStop := preStopSleep(t, c)
	shutdown := dur("shutdown-timeout", defaultShutdownTimeout)
	lease := dur("kv-lease", defaultKVLease)
	role, _ := c.flag("role")
	_, bidi := c.flag("kv-bidirectional")
	bound := shutdown
	if role != "decode" || bidi {
		bound = max(shutdown, lease)
	}
	need := preStop + bound + engineHTTPGrace + graceMargin
	if grace < need {
		t.Errorf("terminationGracePeriodSeconds %v < preStop %v + drain %v (--shutdown-timeout %v, --kv-lease %v) + %v + margin %v",
			grace, preStop, bound, shutdown, lease, engineHTTPGrace, graceMargin)
	}
	if grace <= lease {
		t.Errorf("terminationGracePeriodSeconds %v is not longer than the KV lease %v", grace, lease)
	}
}

func preStopSleep(t *testing.T, c container) time.Duration {
	t.Helper()
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil {
		return 0
	}
	if c.Lifecycle.PreStop.Exec != nil {
		t.Errorf("container %s: an exec preStop hook; the image has no shell (use the sleep action)", c.Name)
	}
	if s := c.Lifecycle.PreStop.Sleep; s != nil {
		return time.Duration(s.Seconds) * time.Second
	}
	return 0
}

func checkScrape(t *testing.T, ann map[string]string, httpPort int) {
	t.Helper()
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/path"] != "/metrics" || ann["prometheus.io/port"] != strconv.Itoa(httpPort) {
		t.Errorf("scrape annotations %v: want prometheus.io/scrape=true, path=/metrics, port=%d", ann, httpPort)
	}
}

// checkHardened checks the security contexts: non-root, RuntimeDefault
// seccomp, no privilege escalation, read-only root, no capabilities.
func checkHardened(t *testing.T, pod podSpec) {
	t.Helper()
	sc := pod.SecurityContext
	if sc == nil || !isTrue(sc.RunAsNonRoot) || sc.SeccompProfile == nil || sc.SeccompProfile.Type != "RuntimeDefault" {
		t.Errorf("pod securityContext: want runAsNonRoot and seccompProfile RuntimeDefault")
	}
	if sc != nil && (sc.RunAsUser == nil || *sc.RunAsUser == 0) {
		t.Errorf("pod securityContext: want a numeric non-root runAsUser")
	}
	for _, c := range pod.Containers {
		cs := c.SecurityContext
		if cs == nil || !isFalse(cs.AllowPrivilegeEscalation) || !isTrue(cs.ReadOnlyRootFilesystem) ||
			cs.Capabilities == nil || !slices.Equal(cs.Capabilities.Drop, []string{"ALL"}) || len(cs.Capabilities.Add) > 0 {
			t.Errorf("container %s securityContext: want allowPrivilegeEscalation false, readOnlyRootFilesystem, capabilities drop [ALL]", c.Name)
		}
	}
	if isTrue(pod.EnableServiceLinks) || pod.EnableServiceLinks == nil {
		t.Errorf("enableServiceLinks is not false (Service env vars such as TANDEM_PORT would reach the process)")
	}
}

// checkSecretRefs checks that every Secret and ConfigMap key c reads exists
// in the render (kustomize renamed the generated ones, with their hash).
func checkSecretRefs(t *testing.T, r *rendered, c container) {
	t.Helper()
	for _, e := range c.Env {
		v := e.ValueFrom
		switch {
		case v == nil:
		case v.SecretKeyRef != nil:
			s := r.get(t, "Secret", v.SecretKeyRef.Name)
			if _, ok := s.Data[v.SecretKeyRef.Key]; !ok {
				t.Errorf("env %s: Secret %s has no key %s", e.Name, s.Metadata.Name, v.SecretKeyRef.Key)
			}
		case v.ConfigMapKeyRef != nil:
			m := r.get(t, "ConfigMap", v.ConfigMapKeyRef.Name)
			if m.Data[v.ConfigMapKeyRef.Key] == "" {
				t.Errorf("env %s: ConfigMap %s has no key %s", e.Name, m.Metadata.Name, v.ConfigMapKeyRef.Key)
			}
		}
	}
}

// writableEmptyDir reports whether path is at or under a writable emptyDir
// mount of c.
func writableEmptyDir(pod podSpec, c container, path string) bool {
	if path == "" {
		return false
	}
	for _, m := range c.VolumeMounts {
		if m.ReadOnly || (path != m.MountPath && !strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")) {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.EmptyDir != nil {
				return true
			}
		}
	}
	return false
}

// checkModelVolume checks that dir is under a read-only mount of a
// ReadOnlyMany PersistentVolumeClaim of the render.
func checkModelVolume(t *testing.T, r *rendered, pod podSpec, c container, dir string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if !strings.HasPrefix(dir, strings.TrimSuffix(m.MountPath, "/")+"/") {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("model mount %s is not readOnly", m.MountPath)
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.PersistentVolumeClaim == nil {
				t.Fatalf("--model=%s: volume %s is not a PersistentVolumeClaim", dir, v.Name)
			}
			var pvc struct {
				AccessModes []string `yaml:"accessModes"`
			}
			r.get(t, "PersistentVolumeClaim", v.PersistentVolumeClaim.ClaimName).decodeSpec(t, &pvc)
			if !slices.Equal(pvc.AccessModes, []string{"ReadOnlyMany"}) {
				t.Errorf("claim %s access modes %v, want [ReadOnlyMany]", v.PersistentVolumeClaim.ClaimName, pvc.AccessModes)
			}
			return
		}
	}
	t.Errorf("--model=%s is on no volume mount", dir)
}

// TestRouter checks the router Deployment: Kubernetes discovery of the two
// engine Services (which exist, select their pools, and have the port it
// uses), its namespace from the downward API, the API keys from the
// Secret, probes, drain, hardening.
func TestRouter(t *testing.T) {
	cp := kubetest.Shared(t)
	root := workTree(t)
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			r := parse(t, kustomize(t, cp, filepath.Join(root, "overlays", overlay)))
			d := r.deployment(t, "tandem-router")
			pod := d.Template.Spec
			c := pod.Containers[0]
			if len(c.Args) == 0 || c.Args[0] != "proxy" {
				t.Fatalf("args %q: want tandem proxy", c.Args)
			}
			if v, _ := c.flag("discovery"); v != "kubernetes" {
				t.Errorf("--discovery=%q, want kubernetes", v)
			}
			if _, ok := c.flag("prefill"); ok {
				t.Errorf("a static --prefill list next to discovery")
			}
			kubeNS, _ := c.flag("kube-namespace")
			if m := varRef.FindStringSubmatch(kubeNS); m == nil || m[0] != kubeNS {
				t.Errorf("--kube-namespace=%q: want $(VAR) of the pod's namespace", kubeNS)
			} else if e, _ := c.env(m[1]); e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
				t.Errorf("--kube-namespace=%s: %s is not the downward API's metadata.namespace", kubeNS, m[1])
			}
			portName, _ := c.flag("kube-port-name")
			for _, role := range []string{"prefill", "decode"} {
				svcName, ok := c.flag(role + "-service")
				if !ok {
					t.Errorf("no --%s-service", role)
					continue
				}
				var ss serviceSpec
				r.get(t, "Service", svcName).decodeSpec(t, &ss)
				engine := r.deployment(t, "tandem-"+role)
				if !(&labelSelector{MatchLabels: ss.Selector}).matches(engine.Template.Metadata.Labels) {
					t.Errorf("--%s-service=%s does not select the %s pods", role, svcName, role)
				}
				found := false
				for _, p := range ss.Ports {
					if p.Name == portName {
						found = true
						if tp := fmt.Sprint(p.TargetPort); tp != "http" && tp != strconv.Itoa(engine.Template.Spec.Containers[0].port("http")) {
							t.Errorf("Service %s port %s targets %s, not the engines' HTTP port", svcName, p.Name, tp)
						}
					}
				}
				if !found {
					t.Errorf("--kube-port-name=%q: Service %s has no such port (the EndpointSlices carry the Service's port names)", portName, svcName)
				}
			}
			for _, env := range []string{"TANDEM_API_KEY", "TANDEM_BACKEND_API_KEY"} {
				if v, ok := c.env(env); !ok || v.ValueFrom == nil || v.ValueFrom.SecretKeyRef == nil {
					t.Errorf("%s does not come from a Secret", env)
				}
			}
			checkSecretRefs(t, r, c)
			// The client key and the engines' key differ: a client cannot
			// bypass the router.
			api, _ := c.env("TANDEM_API_KEY")
			backend, _ := c.env("TANDEM_BACKEND_API_KEY")
			if api.ValueFrom != nil && backend.ValueFrom != nil && *api.ValueFrom.SecretKeyRef == *backend.ValueFrom.SecretKeyRef {
				t.Errorf("the router's client key and backend key are the same Secret key")
			}
			engineKey, _ := r.deployment(t, "tandem-decode").Template.Spec.Containers[0].env("TANDEM_API_KEY")
			if engineKey.ValueFrom == nil || backend.ValueFrom == nil || *engineKey.ValueFrom.SecretKeyRef != *backend.ValueFrom.SecretKeyRef {
				t.Errorf("the engines' TANDEM_API_KEY is not the router's TANDEM_BACKEND_API_KEY")
			}
			if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/health" {
				t.Errorf("readinessProbe: want GET /health (a prefill and a decode engine are healthy)")
			}
			if c.LivenessProbe == nil {
				t.Errorf("no livenessProbe")
			}
			if pod.TerminationGracePeriodSeconds == nil {
				t.Fatalf("no terminationGracePeriodSeconds")
			}
			if grace, need := time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second, preStopSleep(t, c)+proxyShutdownGrace+graceMargin; grace < need {
				t.Errorf("terminationGracePeriodSeconds %v < preStop + the proxy's %v + margin = %v", grace, proxyShutdownGrace, need)
			}
			checkScrape(t, d.Template.Metadata.Annotations, c.port("http"))
			checkHardened(t, pod)
			if isFalse(pod.AutomountServiceAccountToken) {
				t.Errorf("the router's token is not mounted: client-go's in-cluster config needs it")
			}
			if overlay == "production" {
				model, ok := r.resolvedFlag(t, c, "model")
				if !ok {
					t.Errorf("production: the router has no --model (tokenizer): token counts would be estimates")
				} else {
					checkModelVolume(t, r, pod, c, model)
				}
				if *d.Replicas < 2 {
					t.Errorf("production: %d router, want ≥ 2", *d.Replicas)
				}
			}
			// The client-facing Service.
			var ss serviceSpec
			r.get(t, "Service", "tandem").decodeSpec(t, &ss)
			if !(&labelSelector{MatchLabels: ss.Selector}).matches(d.Template.Metadata.Labels) {
				t.Errorf("Service tandem does not select the router")
			}
		})
	}
}

// TestRouterRBAC checks the router's permissions two ways: as written
// (one Role, get/list/watch on endpointslices.discovery.k8s.io, bound to
// the router's account, nothing cluster-wide), and as the real API
// server's RBAC authorizer decides them once the overlay is applied: with
// the account's own token, listing EndpointSlices works and anything else
// is forbidden.
func TestRouterRBAC(t *testing.T) {
	cp := kubetest.Shared(t)
	root := workTree(t)
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			t.Parallel()
			r := parse(t, kustomize(t, cp, filepath.Join(root, "overlays", overlay)))
			if n := len(r.ofKind("ClusterRole")) + len(r.ofKind("ClusterRoleBinding")); n > 0 {
				t.Errorf("%d cluster-wide RBAC objects; the router needs only its namespace", n)
			}
			sa := r.deployment(t, "tandem-router").Template.Spec.ServiceAccountName
			var bound []string
			for _, b := range r.ofKind("RoleBinding") {
				for _, s := range b.Subjects {
					if s.Kind == "ServiceAccount" && s.Name == sa {
						if b.RoleRef.Kind != "Role" {
							t.Errorf("RoleBinding %s refers to a %s", b.Metadata.Name, b.RoleRef.Kind)
						}
						if s.Namespace != "" && s.Namespace != b.Metadata.Namespace {
							t.Errorf("RoleBinding %s binds an account of namespace %s", b.Metadata.Name, s.Namespace)
						}
						bound = append(bound, b.RoleRef.Name)
					}
				}
			}
			if len(bound) != 1 {
				t.Fatalf("the router's account %s is bound to %d Roles, want 1", sa, len(bound))
			}
			role := r.get(t, "Role", bound[0])
			want := []policyRule{{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}}}
			if fmt.Sprint(role.Rules) != fmt.Sprint(want) {
				t.Errorf("Role %s rules %+v, want exactly %+v", role.Metadata.Name, role.Rules, want)
			}

			// Now for real: apply the overlay (no controllers run, so
			// nothing starts) and ask the authorizer.
			ns := namespace(t, cp, "rbac-"+overlay)
			if out, err := cp.Kubectl(t.Context(), inNamespace(t, cp, root, "overlays/"+overlay, ns), "apply", "-f", "-"); err != nil {
				t.Fatalf("applying the %s overlay: %v\n%s", overlay, err, out)
			}
			as := "system:serviceaccount:" + ns + ":" + sa
			for _, tc := range []struct {
				verb, resource, ns string
				want               string
			}{
				{"get", "endpointslices.discovery.k8s.io", ns, "yes"},
				{"list", "endpointslices.discovery.k8s.io", ns, "yes"},
				{"watch", "endpointslices.discovery.k8s.io", ns, "yes"},
				{"list", "endpointslices.discovery.k8s.io", "default", "no"},
				{"create", "endpointslices.discovery.k8s.io", ns, "no"},
				{"update", "endpointslices.discovery.k8s.io", ns, "no"},
				{"list", "endpoints", ns, "no"},
				{"list", "pods", ns, "no"},
				{"get", "secrets", ns, "no"},
				{"list", "services", ns, "no"},
				{"list", "configmaps", ns, "no"},
			} {
				out, _ := cp.Kubectl(t.Context(), nil, "auth", "can-i", tc.verb, tc.resource, "-n", tc.ns, "--as", as)
				if got := lastLine(string(out)); got != tc.want {
					t.Errorf("can %s %s %s in %s? %q, want %q", as, tc.verb, tc.resource, tc.ns, got, tc.want)
				}
			}
			// With a token of the account, as client-go in the pod has it.
			tok, err := cp.Kubectl(t.Context(), nil, "create", "token", sa, "-n", ns, "--duration=10m")
			if err != nil {
				t.Fatalf("creating a token for %s: %v", sa, err)
			}
			token := lastLine(string(tok))
			if out, err := cp.Kubectl(t.Context(), nil, "get", "endpointslices", "-n", ns, "--token="+token); err != nil {
				t.Errorf("the router's token cannot list EndpointSlices: %v\n%s", err, out)
			}
			out, err := cp.Kubectl(t.Context(), nil, "get", "secrets", "-n", ns, "--token="+token)
			if err == nil || !strings.Contains(string(out), "forbidden") {
				t.Errorf("the router's token can read Secrets:\n%s", out)
			}
		})
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// TestDisruptionBudgets checks that each pool, and the router, has one
// PodDisruptionBudget selecting it alone, which a node drain can satisfy.
func TestDisruptionBudgets(t *testing.T) {
	cp := kubetest.Shared(t)
	root := workTree(t)
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			r := parse(t, kustomize(t, cp, filepath.Join(root, "overlays", overlay)))
			pdbs := r.ofKind("PodDisruptionBudget")
			for _, d := range r.ofKind("Deployment") {
				var ds deploymentSpec
				d.decodeSpec(t, &ds)
				replicas := 1
				if ds.Replicas != nil {
					replicas = *ds.Replicas
				}
				var mine []string
				for _, p := range pdbs {
					var ps pdbSpec
					p.decodeSpec(t, &ps)
					if !ps.Selector.matches(ds.Template.Metadata.Labels) {
						continue
					}
					mine = append(mine, p.Metadata.Name)
					if (ps.MinAvailable == nil) == (ps.MaxUnavailable == nil) {
						t.Errorf("PDB %s: want exactly one of minAvailable and maxUnavailable", p.Metadata.Name)
					}
					if n, ok := ps.MinAvailable.(int); ok && n >= replicas {
						t.Errorf("PDB %s: minAvailable %d of %d replicas: no pod could ever be evicted (node drains would hang)", p.Metadata.Name, n, replicas)
					}
					if n, ok := ps.MaxUnavailable.(int); ok && n < 1 {
						t.Errorf("PDB %s: maxUnavailable %d", p.Metadata.Name, n)
					}
				}
				if len(mine) != 1 {
					t.Errorf("%s: %d PodDisruptionBudgets select its pods (%v), want 1", d.Metadata.Name, len(mine), mine)
				}
			}
			if overlay == "production" {
				for _, name := range []string{"tandem-prefill", "tandem-decode"} {
					var ps pdbSpec
					r.get(t, "PodDisruptionBudget", name).decodeSpec(t, &ps)
					if ps.MinAvailable == nil {
						t.Errorf("production: PDB %s sets no minAvailable", name)
					}
				}
			}
		})
	}
}

// TestNetworkPolicies checks production's NetworkPolicies: a prefill's KV
// side channel is open to decode pods only, the engines' HTTP port to the
// router (and the monitoring namespace) only, and a decode has no KV port
// open.
func TestNetworkPolicies(t *testing.T) {
	cp := kubetest.Shared(t)
	r := parse(t, kustomize(t, cp, filepath.Join(workTree(t), "overlays", "production")))
	labels := map[string]map[string]string{}
	for _, name := range []string{"prefill", "decode", "router"} {
		labels[name] = r.deployment(t, "tandem-"+name).Template.Metadata.Labels
	}
	// allowed: for each engine role, port → the peers admitted there.
	for _, role := range []string{"prefill", "decode"} {
		var policies []networkPolicySpec
		for _, o := range r.ofKind("NetworkPolicy") {
			var np networkPolicySpec
			o.decodeSpec(t, &np)
			if np.PodSelector.matches(labels[role]) {
				policies = append(policies, np)
			}
		}
		if len(policies) == 0 {
			t.Errorf("no NetworkPolicy selects the %s pods", role)
			continue
		}
		peers := map[string][]string{} // port -> "pod:<role>" or "namespace:<name>"
		for _, np := range policies {
			if !slices.Contains(np.PolicyTypes, "Ingress") {
				t.Errorf("%s: a policy without policyTypes Ingress", role)
			}
			for _, rule := range np.Ingress {
				if len(rule.From) == 0 || len(rule.Ports) == 0 {
					t.Errorf("%s: an ingress rule without from or ports opens it to everyone or on every port", role)
				}
				for _, p := range rule.Ports {
					port := fmt.Sprint(p.Port)
					for _, f := range rule.From {
						switch {
						case f.PodSelector != nil && f.NamespaceSelector == nil:
							for name, l := range labels {
								if f.PodSelector.matches(l) {
									peers[port] = append(peers[port], "pod:"+name)
								}
							}
						case f.NamespaceSelector != nil:
							peers[port] = append(peers[port], "namespace:"+f.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"])
						}
					}
				}
			}
		}
		slices.Sort(peers["http"])
		if want := []string{"namespace:monitoring", "pod:router"}; !slices.Equal(peers["http"], want) {
			t.Errorf("%s: port http admits %v, want %v", role, peers["http"], want)
		}
		wantKV := []string{"pod:decode"}
		if role == "decode" {
			wantKV = nil
		}
		if !slices.Equal(peers["kv"], wantKV) {
			t.Errorf("%s: port kv admits %v, want %v", role, peers["kv"], wantKV)
		}
		for port := range peers {
			if port != "http" && port != "kv" {
				t.Errorf("%s: port %s is opened, want only http and kv", role, port)
			}
		}
	}
}

// TestFlagsParse runs the real binary with every container's args, $(VAR)s
// expanded, and -h appended: flags are parsed in order, so a flag the
// binary does not define, or a value it cannot parse, fails before the
// help, and the help exits 0.
func TestFlagsParse(t *testing.T) {
	cp := kubetest.Shared(t)
	bin := tandemBinary(t)
	root := workTree(t)
	for _, overlay := range overlays {
		r := parse(t, kustomize(t, cp, filepath.Join(root, "overlays", overlay)))
		for _, d := range r.ofKind("Deployment") {
			var ds deploymentSpec
			d.decodeSpec(t, &ds)
			for _, c := range ds.Template.Spec.Containers {
				t.Run(overlay+"/"+d.Metadata.Name, func(t *testing.T) {
					args := make([]string, 0, len(c.Args)+1)
					for _, a := range c.Args {
						args = append(args, r.resolve(t, c, a))
					}
					args = append(args, "-h")
					cmd := exec.CommandContext(t.Context(), bin, args...)
					cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir())
					out, err := cmd.CombinedOutput()
					if err != nil {
						t.Fatalf("tandem %s: %v\n%s", strings.Join(args, " "), err, firstLines(string(out), 5))
					}
				})
			}
		}
	}
}

// TestRouterDiscoversWithItsRole runs the real router (`tandem proxy`) with
// the single-node overlay's arguments against the API server, signed in
// with a token of the overlay's own ServiceAccount, in a namespace where
// the overlay was applied: the Role it is bound to lets its EndpointSlice
// informers list and watch (both pools sync, no watch error). With the
// engines' account, which is bound to nothing, the lists are forbidden.
// No EndpointSlice is created: the router would health-check its
// addresses, and the API server refuses loopback ones.
func TestRouterDiscoversWithItsRole(t *testing.T) {
	cp := kubetest.Shared(t)
	bin := tandemBinary(t)
	root := workTree(t)
	ns := namespace(t, cp, "discovery")
	objs := inNamespace(t, cp, root, "overlays/single-node", ns)
	if out, err := cp.Kubectl(t.Context(), objs, "apply", "-f", "-"); err != nil {
		t.Fatalf("applying the single-node overlay: %v\n%s", err, out)
	}
	r := parse(t, objs)
	d := r.deployment(t, "tandem-router")
	c := d.Template.Spec.Containers[0]
	for _, tc := range []struct {
		account string
		allowed bool
	}{
		{d.Template.Spec.ServiceAccountName, true},
		{r.deployment(t, "tandem-prefill").Template.Spec.ServiceAccountName, false},
	} {
		t.Run(tc.account, func(t *testing.T) {
			tok, err := cp.Kubectl(t.Context(), nil, "create", "token", tc.account, "-n", ns, "--duration=10m")
			if err != nil {
				t.Fatal(err)
			}
			kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
			kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
  - name: test
    cluster: {server: %q, certificate-authority: %q}
users:
  - name: %s
    user: {token: %q}
contexts:
  - name: test
    context: {cluster: test, user: %s, namespace: %s}
current-context: test
`, cp.URL, cp.CAFile, tc.account, lastLine(string(tok)), tc.account, ns)
			if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
				t.Fatal(err)
			}
			port := testutil.FreePort(t)
			var args []string
			for _, a := range c.Args {
				args = append(args, r.resolve(t, c, a))
			}
			// Later flags win: listen on loopback, the test's namespace,
			// the account's kubeconfig in place of the in-cluster one.
			args = append(args, "--host=127.0.0.1", "--port="+strconv.Itoa(port), "--kube-namespace="+ns, "--kubeconfig="+kubeconfig)
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), "TANDEM_API_KEY=client-key", "TANDEM_BACKEND_API_KEY=engine-key", "KUBERNETES_SERVICE_HOST=")
			var logs bytes.Buffer
			cmd.Stdout, cmd.Stderr = &logs, &logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			defer func() {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(20 * time.Second):
					t.Errorf("the router did not exit within 20 s of SIGTERM")
					_ = cmd.Process.Kill()
					<-exited
				}
				if t.Failed() {
					t.Logf("router log:\n%s", logs.String())
				}
			}()
			base := "http://127.0.0.1:" + strconv.Itoa(port)
			deadline := time.Now().Add(30 * time.Second)
			for {
				select {
				case err := <-exited:
					exited <- err
					t.Fatalf("the router exited: %v\n%s", err, logs.String())
				default:
				}
				m := scrape(base + "/metrics")
				synced := m[`tandem:proxy_discovery_synced{role="prefill"}`] == 1 && m[`tandem:proxy_discovery_synced{role="decode"}`] == 1
				failed := m[`tandem:proxy_discovery_watch_errors_total{role="prefill"}`] > 0 && m[`tandem:proxy_discovery_watch_errors_total{role="decode"}`] > 0
				if tc.allowed && synced {
					// The watch starts right after the list: give a
					// forbidden watch time to show.
					time.Sleep(time.Second)
					m = scrape(base + "/metrics")
					if n := m[`tandem:proxy_discovery_watch_errors_total{role="prefill"}`] + m[`tandem:proxy_discovery_watch_errors_total{role="decode"}`]; n > 0 {
						t.Errorf("synced, but with %v watch errors", n)
					}
					// Ready needs a healthy prefill and decode; there are none.
					if code := httpStatus(base + "/health"); code != 503 {
						t.Errorf("/health with no engines: %d, want 503 (the router is not ready)", code)
					}
					return
				}
				if !tc.allowed && failed {
					if synced {
						t.Errorf("the account without a Role synced")
					}
					if !strings.Contains(logs.String(), "forbidden") {
						t.Errorf("the router's log does not say the list was forbidden")
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("after 30 s: synced %v, watch errors %v (want allowed=%v)", synced, failed, tc.allowed)
				}
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
}

// TestProbesAgainstTheEngine runs the real engine (`tandem serve`) with the
// single-node overlay's prefill and decode arguments, on loopback, and asks
// what the kubelet and Prometheus would: the startup, readiness and
// liveness probes' paths answer 200 once the model is loaded, without an
// API key, as does the scrape path, while the API itself wants the key.
// Then SIGTERM, as on a pod's deletion: the engine exits with status 0
// well within its terminationGracePeriodSeconds.
func TestProbesAgainstTheEngine(t *testing.T) {
	cp := kubetest.Shared(t)
	bin := tandemBinary(t)
	r := parse(t, kustomize(t, cp, filepath.Join(workTree(t), "overlays", "single-node")))
	for _, role := range []string{"prefill", "decode"} {
		t.Run(role, func(t *testing.T) {
			d := r.deployment(t, "tandem-"+role)
			c := d.Template.Spec.Containers[0]
			port, kvPort := testutil.FreePort(t), testutil.FreePort(t)
			var args []string
			for _, a := range c.Args {
				args = append(args, r.resolve(t, c, a))
			}
			// Later flags win: loopback in place of the pod's addresses.
			args = append(args, "--host=127.0.0.1", "--port="+strconv.Itoa(port), "--kv-host=127.0.0.1", "--kv-port="+strconv.Itoa(kvPort))
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir(), "TANDEM_KV_SECRET="+randomHex(t), "TANDEM_API_KEY=engine-key")
			var logs bytes.Buffer
			cmd.Stdout, cmd.Stderr = &logs, &logs
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			stopped := false
			defer func() {
				if !stopped {
					_ = cmd.Process.Kill()
					<-exited
				}
				if t.Failed() {
					t.Logf("engine log:\n%s", logs.String())
				}
			}()
			base := "http://127.0.0.1:" + strconv.Itoa(port)
			deadline := time.Now().Add(60 * time.Second)
			for httpStatus(base+c.ReadinessProbe.HTTPGet.Path) != 200 {
				select {
				case err := <-exited:
					stopped = true
					t.Fatalf("the engine exited: %v", err)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("readiness %s not 200 after 60 s", c.ReadinessProbe.HTTPGet.Path)
				}
				time.Sleep(100 * time.Millisecond)
			}
			for what, p := range map[string]*probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe} {
				if code := httpStatus(base + p.HTTPGet.Path); code != 200 {
					t.Errorf("%s probe GET %s: %d, want 200", what, p.HTTPGet.Path, code)
				}
			}
			if code := httpStatus(base + d.Template.Metadata.Annotations["prometheus.io/path"]); code != 200 {
				t.Errorf("scrape path: %d, want 200 without a key", code)
			}
			if m := scrape(base + "/metrics"); m == nil || !hasPrefix(m, "vllm:num_requests_waiting") {
				t.Errorf("/metrics lacks vllm:num_requests_waiting")
			}
			if code := httpStatus(base + "/v1/models"); code != 401 {
				t.Errorf("/v1/models without the key: %d, want 401", code)
			}
			grace := time.Duration(*d.Template.Spec.TerminationGracePeriodSeconds) * time.Second
			start := time.Now()
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-exited:
				stopped = true
				if err != nil {
					t.Errorf("exit after SIGTERM: %v, want status 0 (nothing cut short)", err)
				}
				t.Logf("exited %v after SIGTERM (grace period %v)", time.Since(start).Round(time.Millisecond), grace)
			case <-time.After(grace):
				t.Errorf("still running %v after SIGTERM: the kubelet would SIGKILL it", grace)
			}
		})
	}
}

func hasPrefix(m map[string]float64, prefix string) bool {
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

// scrape reads a Prometheus text page into series → value (nil on error).
func scrape(url string) map[string]float64 {
	resp, err := http.Get(url)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil
	}
	m := map[string]float64{}
	for line := range strings.SplitSeq(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m
}

func httpStatus(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// TestSecretsStayOutOfGit checks that no key is committed or baked into the
// image: every overlay's secretGenerator reads files its .gitignore lists
// and the image's build context leaves out, and the example's KV secret is
// too short for an engine to accept, so an unedited copy cannot run.
func TestSecretsStayOutOfGit(t *testing.T) {
	ignore, err := os.ReadFile("../Dockerfile.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Fields(string(ignore)), "**/secrets.env") {
		t.Errorf("deploy/Dockerfile.dockerignore does not leave out **/secrets.env")
	}
	for _, overlay := range overlays {
		dir := filepath.Join("overlays", overlay)
		var k struct {
			SecretGenerator []struct {
				Name  string   `yaml:"name"`
				Envs  []string `yaml:"envs"`
				Files []string `yaml:"files"`
			} `yaml:"secretGenerator"`
		}
		b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &k); err != nil {
			t.Fatal(err)
		}
		gi, _ := os.ReadFile(filepath.Join(dir, ".gitignore"))
		ignored := strings.Fields(string(gi))
		if len(k.SecretGenerator) == 0 {
			t.Errorf("%s: no secretGenerator", overlay)
		}
		for _, g := range k.SecretGenerator {
			if len(g.Files) > 0 {
				t.Errorf("%s: secretGenerator %s uses files; the tests only provide envs", overlay, g.Name)
			}
			for _, f := range g.Envs {
				if !slices.Contains(ignored, f) {
					t.Errorf("%s: %s is not in its .gitignore", overlay, f)
				}
				ex, err := os.ReadFile(filepath.Join(dir, f+".example"))
				if err != nil {
					t.Errorf("%s: no %s.example saying how to make %s: %v", overlay, f, f, err)
					continue
				}
				for line := range strings.SplitSeq(string(ex), "\n") {
					if v, ok := strings.CutPrefix(line, "kv-secret="); ok && len(strings.TrimSpace(v)) >= 16 {
						t.Errorf("%s: the example's kv-secret %q would be accepted (≥ 16 bytes): an unedited copy would run with a known secret", overlay, v)
					}
				}
			}
		}
	}
}

// TestDockerfile checks what the manifests assume of deploy/Dockerfile (no
// docker here to build it): a static binary of ./cmd/tandem, and the
// numeric non-root user the pods run as.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"CGO_ENABLED=0", "./cmd/tandem", "USER 65532:65532", `ENTRYPOINT ["/usr/local/bin/tandem"]`} {
		if !strings.Contains(s, want) {
			t.Errorf("deploy/Dockerfile lacks %q", want)
		}
	}
	if !regexp.MustCompile(`(?m)^FROM golang:1\.\d+.* AS build$`).MatchString(s) {
		t.Errorf("deploy/Dockerfile: no golang build stage")
	}
}
