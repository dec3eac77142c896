// Package internal_test holds the module's import-graph test: one table says
// which package may import which, in the manner of the Go tree's own
// go/build/deps_test.go, and the test fails when the code drifts from it.
package internal_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
)

// module is the module path; table keys and internal entries are relative
// to it.
const module = "github.com/tandem-serve/tandem"

// allowed lists, for every package of the module, the imports it may have
// beyond the standard library: packages of this module (relative to the
// module path) and third-party packages (full paths; a trailing "/..."
// allows a whole tree). A package missing from the table fails the test, so
// a new package comes with its row.
//
// Only the imports of a package's own (non-test) files are checked; the
// imports of its _test.go files are ignored, so tests may use any helper
// (kubetest, testhosts, testmodels, gguf/ggufspec, modelinit). The converse
// holds by the table: no non-test row lists those test helpers.
//
// The rows are grouped by floor, from the leaves up (the review of
// 2026-12's §1.1): a package imports only from floors below its own. The
// rules that matter most are restated as linkRules and pureRules below,
// which check the transitive closure and the standard library too.
var allowed = map[string][]string{
	// Floor 0, leaves: standard library only (plus at most one
	// third-party module). kvlayout is the KV pool's geometry, kept out of
	// the model so that the KV side (kvcache, kvxfer, kvevents) links no
	// model, GGUF or kernel code; gguf is a file format the model and the
	// tokenizer both read.
	"internal/apierror":                   {},
	"internal/clock":                      {},
	"internal/defaultmodel":               {},
	"internal/gguf":                       {},
	"internal/httpleg":                    {},
	"internal/kvlayout":                   {},
	"internal/logid":                      {},
	"internal/hugemem":                    {"golang.org/x/sys/unix"}, // weights' memory in transparent huge pages
	"internal/router":                     {},
	"internal/bench/workload":             {},
	"internal/planner":                    {}, // the P:D model and the pool planner: pure, std only
	"internal/metrics":                    {"github.com/prometheus/client_golang/..."},
	"internal/tracing":                    {"go.opentelemetry.io/otel/..."}, // OpenTelemetry setup, propagation, span names
	"internal/tensor":                     {"internal/hugemem", "golang.org/x/sys/cpu"},
	"internal/kubediscovery":              {"github.com/go-logr/logr", "github.com/prometheus/client_golang/...", "k8s.io/..."},
	"internal/kvparams":                   {}, // vLLM's kv_transfer_params, typed: std only
	"internal/hoststat":                   {}, // procfs CPU, load and RSS: std only
	"internal/progress":                   {}, // progress on stderr for long commands: std only
	"internal/httpguard":                  {"internal/apierror"},
	"internal/httpguard/httpguardtest":    {}, // the raw-TCP framing check the servers' tests share
	"internal/kvevents/zmtp":              {}, // the ZMTP sockets under kvevents: std only
	"internal/router/decider/always":      {"internal/router"},
	"internal/router/decider/conditional": {"internal/router"},
	"internal/router/decider/priced":      {"internal/router", "internal/router/decider/conditional"},
	"internal/router/filter/healthy":      {"internal/router"},
	"internal/router/filter/saturated":    {"internal/router"},
	"internal/router/picker/maxscore":     {"internal/router"},
	"internal/router/picker/p2c":          {"internal/router"},
	"internal/router/picker/roundrobin":   {"internal/router"},
	"internal/router/scorer/kvusage":      {"internal/router"},
	"internal/router/scorer/load":         {"internal/router"},
	"internal/router/scorer/locality":     {"internal/router"},
	"internal/router/scorer/prefix":       {"internal/router"},
	"internal/router/scorer/queue":        {"internal/router"},
	"internal/router/factory": {
		"internal/router",
		"internal/router/decider/always", "internal/router/decider/conditional", "internal/router/decider/priced",
		"internal/router/filter/healthy", "internal/router/filter/saturated",
		"internal/router/picker/maxscore", "internal/router/picker/p2c", "internal/router/picker/roundrobin",
		"internal/router/scorer/kvusage", "internal/router/scorer/load", "internal/router/scorer/locality",
		"internal/router/scorer/prefix", "internal/router/scorer/queue",
	},

	// Floor 1: the model computes over a KV pool it is handed; it never
	// allocates blocks or schedules (no kvcache, no sched).
	"internal/model":             {"internal/gguf", "internal/hugemem", "internal/kvlayout", "internal/model/safetensors", "internal/tensor"},
	"internal/model/safetensors": {"internal/hugemem"},
	"internal/sample":            {"internal/tensor"},

	// Floor 2: the KV pool (pure accounting in blocks.go, checked by its
	// own test, plus the memfd bytes) and the tokenizer.
	"internal/kvcache":   {"internal/kvlayout", "golang.org/x/sys/unix"},
	"internal/tokenizer": {"internal/gguf", "github.com/ardanlabs/jinja", "github.com/dlclark/regexp2/v2", "golang.org/x/text/unicode/norm"},

	// Floor 3. sched is a pure state machine (see pureRules). kvxfer is
	// the trust boundary, reviewable alone: the KV pool and small leaves,
	// nothing of the model, kernels, engine or scheduler. kvevents is
	// vLLM's event schema and its ZMTP transport on the KV pool alone.
	"internal/sched":     {"internal/kvcache", "internal/kvlayout"},
	"internal/modelinit": {"internal/model/safetensors", "internal/tensor", "internal/tokenizer"},
	"internal/kvxfer":    {"internal/clock", "internal/kvcache", "internal/kvlayout", "internal/logid", "internal/metrics", "golang.org/x/sync/singleflight", "golang.org/x/sys/unix"},
	"internal/kvevents":  {"internal/kvcache", "internal/kvlayout", "internal/kvevents/zmtp", "github.com/prometheus/client_golang/...", "github.com/tinylib/msgp/msgp"},

	// Floor 4: the engine's step loop, and the router's KV index (the
	// router side of kv-events).
	"internal/engine": {
		"internal/clock", "internal/kvcache", "internal/kvlayout", "internal/logid", "internal/metrics",
		"internal/model", "internal/sample", "internal/sched", "internal/tensor", "internal/tokenizer",
		"internal/kvparams", // a request's kv_transfer_params, typed; the engine passes them to its connector unread
		"github.com/google/uuid",
	},
	"internal/router/kvindex": {"internal/kvevents", "internal/router/scorer/prefix", "github.com/prometheus/client_golang/..."},

	// Floor 5. The engine does not know P/D: the connector plugs in
	// through sched.Connector and engine.KVWorker. The proxy (the router
	// process) links neither the engine nor the model nor client-go: it
	// needs only the error shape (apierror) and the router plugins.
	"internal/sim":         {"internal/engine", "internal/kvlayout", "internal/model", "internal/tensor"},
	"internal/kvconnector": {"internal/clock", "internal/engine", "internal/kvcache", "internal/kvlayout", "internal/kvparams", "internal/kvxfer", "internal/logid", "internal/metrics", "internal/sched"},
	"internal/openai":      {"internal/apierror", "internal/engine", "internal/httpguard", "internal/kvparams", "internal/sample", "internal/tokenizer", "internal/tracing", "go.opentelemetry.io/otel/..."},
	"internal/proxy": {
		"internal/apierror", "internal/httpguard", "internal/httpleg", "internal/kvparams", "internal/planner", "internal/tokenizer",
		"internal/router", "internal/router/decider/always", "internal/router/decider/conditional",
		"internal/router/decider/priced", "internal/router/factory",
		"internal/router/filter/saturated", "internal/router/scorer/prefix",
		"internal/tracing", "go.opentelemetry.io/otel/trace",
		"github.com/google/uuid", "github.com/prometheus/client_golang/...",
	},

	// Floor 6: the engine process assembled (serve, drain, RAM sizing, the
	// kv-events sink; another branch moves it out of cmd/tandem).
	"internal/server": {
		"internal/apierror", "internal/engine", "internal/httpguard", "internal/hugemem", "internal/kvconnector", "internal/kvevents", "internal/kvlayout", "internal/kvxfer",
		"internal/metrics", "internal/model", "internal/openai", "internal/sched", "internal/sim", "internal/tensor",
		"internal/tokenizer",
		"github.com/google/uuid",
	},
	"internal/server/servertest": {"internal/defaultmodel", "internal/kvconnector", "internal/kvxfer", "internal/openai", "internal/sched", "internal/server", "internal/sim"}, // starts engines in-process for tests

	// Floor 7: process launching and the benchmarks that drive processes.
	"internal/launch":           {"internal/defaultmodel", "internal/gguf", "internal/kvxfer", "internal/openai", "internal/planner", "internal/proxy", "internal/tokenizer", "github.com/prometheus/client_golang/...", "golang.org/x/sys/unix"},
	"internal/bench":            {"internal/bench/workload", "internal/planner", "internal/progress", "internal/tokenizer"}, // the client tokenizes workload prompts; the P:D model is the planner's
	"internal/bench/benchtest":  {},                                                                                         // fake servers for the benchmark tests
	"internal/bench/plot":       {"internal/bench", "gonum.org/v1/plot/..."},
	"internal/bench/soak":       {"internal/bench", "internal/hoststat", "internal/progress"},
	"internal/bench/experiment": {"internal/bench", "internal/bench/plot", "internal/bench/soak", "internal/bench/workload", "internal/defaultmodel", "internal/hoststat", "internal/kvxfer", "internal/launch", "internal/modelinit", "internal/progress"},

	// Floor 8: the command, wiring only.
	"cmd/tandem": {
		"internal/bench", "internal/bench/experiment", "internal/bench/plot", "internal/bench/soak", "internal/bench/workload",
		"internal/defaultmodel", "internal/engine", "internal/gguf", "internal/hoststat", "internal/hugemem", "internal/kubediscovery",
		"internal/kvconnector", "internal/kvevents", "internal/kvlayout", "internal/kvxfer", "internal/launch",
		"internal/metrics", "internal/model", "internal/modelinit", "internal/openai", "internal/planner", "internal/proxy",
		"internal/progress", "internal/router/factory", "internal/router/kvindex", "internal/sched", "internal/server", "internal/sim",
		"internal/tensor", "internal/tokenizer", "internal/tracing",
		"github.com/google/uuid", "go.opentelemetry.io/otel/attribute", "go.yaml.in/yaml/v3", "golang.org/x/sys/unix", "k8s.io/klog/v2",
	},

	// Test support and test-only packages. No row above lists them, so
	// no production package can import them.
	"internal":                 {},                    // this test
	"internal/kubetest":        {"internal/testutil"}, // runs a real etcd and kube-apiserver for tests
	"internal/promtest":        {"internal/testutil"}, // runs a real Prometheus for tests
	"internal/jaegertest":      {"internal/testutil"}, // runs a real Jaeger for tests
	"internal/bochs":           {"internal/testutil"}, // runs machine code in the Bochs emulator for tests
	"internal/qemu":            {"internal/testutil"}, // runs a package's arm64 tests under QEMU for tests
	"internal/testhosts":       {"internal/testutil"}, // network namespaces for tests
	"internal/testmodels":      {},
	"internal/vllmtest":        {}, // starts a real vllm serve for interop tests: std only
	"internal/testutil":        {"internal/testmodels"},
	"internal/testutil/loaded": {"internal/model", "internal/tensor", "internal/testmodels", "internal/testutil", "internal/tokenizer"}, // stories260K loaded once per test binary
	"internal/gguf/ggufspec":   {},
	"internal/e2e":             {},
	"internal/e2e/kube":        {},
	"deploy/kubernetes":        {},
	"deploy/observability":     {}, // the rules' and dashboard's tests
}

// notYetMerged are the rows above for packages that other branches are
// adding at the same time as this table. The test accepts their absence;
// once a package exists, its name here fails the test, so the list empties
// as the branches land.
var notYetMerged = []string{}

// linkRules are the layering rules that matter most, checked on each
// package's whole dependency closure (what its binary links), not only its
// direct imports: a rule broken two floors down shows here with the
// package that states it.
var linkRules = []struct {
	pkg, why string
	never    []string // module-relative or full paths; a trailing "/..." bans a tree
}{
	{"internal/proxy", "the router process links neither the engine nor the model nor client-go",
		[]string{"internal/engine", "internal/openai", "internal/sched", "internal/kvconnector", "internal/kvxfer", "internal/model/...", "internal/tensor/...", "internal/kubediscovery", "k8s.io/..."}},
	{"internal/kvxfer", "the trust boundary is reviewable alone: no model, GGUF, kernels, engine or scheduler",
		[]string{"internal/model/...", "internal/tensor/...", "internal/gguf/...", "internal/engine", "internal/sched", "internal/tokenizer"}},
	{"internal/kvevents", "the router's KV-event side links no model, GGUF or kernels",
		[]string{"internal/model/...", "internal/tensor/...", "internal/gguf/...", "internal/engine", "internal/sched"}},
	{"internal/router/kvindex", "the router's KV index links no model, GGUF or kernels",
		[]string{"internal/model/...", "internal/tensor/...", "internal/gguf/...", "internal/engine", "internal/sched"}},
	{"internal/kvcache", "the KV pool links no model or kernels",
		[]string{"internal/model/...", "internal/tensor/...", "internal/gguf/..."}},
	{"internal/sched", "the scheduler is a pure state machine: no network, no engine, no model",
		[]string{"net", "net/http", "internal/engine", "internal/model/...", "internal/tensor/...", "internal/kvxfer"}},
	{"internal/engine", "the engine does not know P/D or HTTP serving",
		[]string{"internal/kvconnector", "internal/kvxfer", "internal/kvevents", "internal/openai", "internal/proxy"}},
	{"internal/model", "the model computes; it never allocates KV blocks, schedules or serves",
		[]string{"internal/kvcache", "internal/sched", "internal/engine", "net", "net/http"}},
	{"internal/router/...", "routing policies are pure: no engine, model or client-go",
		[]string{"internal/engine", "internal/model/...", "internal/tensor/...", "k8s.io/..."}},
}

// pureRules name packages that must not do I/O, keep time or start
// goroutines, and the standard library packages that would let them: the
// direct imports of their non-test files are checked.
var pureRules = []struct {
	pkg, why string
	allow    []string // impure packages it may import all the same
}{
	{"internal/sched", "the scheduler is raft-style: the step loop does the I/O and keeps the clock", nil},
	{"internal/kvlayout", "the layout is arithmetic", nil},
	{"internal/planner", "the planner is a state machine: observations and the time in, a decision out; the proxy scrapes and keeps the clock",
		[]string{"time"}}, // time.Time and time.Duration values: Decide is told now
}

// impure are the standard library packages a pure package may not import.
var impure = []string{
	"bufio", "io", "io/fs", "io/ioutil", "log", "log/slog", "net", "net/...", "os", "os/...",
	"runtime", "sync", "sync/atomic", "syscall", "time", "unsafe",
}

// pkg is the part of `go list -json` this test reads.
type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
	Error      *struct{ Err string }
}

// listModule returns the module's packages by module-relative path, from
// one run of `go list` shared by the tests. It fails the test, never skips
// it, when the go command cannot run: an unchecked table is a table nobody
// trusts.
func listModule(t *testing.T) map[string]pkg {
	t.Helper()
	pkgs, err := listed()
	if err != nil {
		t.Fatalf("the import-graph test needs `go list ./...` to run: %v", err)
	}
	return pkgs
}

var listed = sync.OnceValues(func() (map[string]pkg, error) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("no go command on PATH: %w", err)
	}
	cmd := exec.Command(goCmd, "list", "-e", "-json=ImportPath,Imports,Deps,Error", "./...")
	cmd.Dir = ".." // the module root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, stderr.Bytes())
	}
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("reading its output: %w", err)
		}
		if p.Error != nil {
			return nil, fmt.Errorf("package %s: %s", p.ImportPath, p.Error.Err)
		}
		rel, ok := relative(p.ImportPath)
		if !ok {
			return nil, fmt.Errorf("it listed %s, outside module %s", p.ImportPath, module)
		}
		pkgs[rel] = p
	}
	if len(pkgs) == 0 {
		return nil, errors.New("it listed no packages")
	}
	return pkgs, nil
})

// relative returns path relative to the module ("" for the module root
// itself) and whether path is in the module.
func relative(path string) (string, bool) {
	if path == module {
		return "", true
	}
	return strings.CutPrefix(path, module+"/")
}

// isStd reports whether path is a standard library package (its first
// element has no dot).
func isStd(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

// matches reports whether path (module-relative for the module's own
// packages) is pattern or, for a pattern ending in "/...", in its tree.
func matches(pattern, path string) bool {
	if tree, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == tree || strings.HasPrefix(path, tree+"/")
	}
	return path == pattern
}

func matchesAny(patterns []string, path string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return matches(p, path) })
}

// short is path relative to the module for the module's packages, else
// path itself.
func short(path string) string {
	if rel, ok := relative(path); ok {
		return rel
	}
	return path
}

func TestImportsFollowTheTable(t *testing.T) {
	pkgs := listModule(t)
	names := make([]string, 0, len(pkgs))
	for name := range pkgs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		row, ok := allowed[name]
		if !ok {
			t.Errorf("package %s has no row in the import table (internal/deps_test.go): add one listing what it may import", name)
			continue
		}
		for _, imp := range pkgs[name].Imports {
			if isStd(imp) {
				continue
			}
			if s := short(imp); !matchesAny(row, s) {
				t.Errorf("package %s imports %s, which its row in the import table does not allow: move the code, or change the table if the layering really changes", name, s)
			}
		}
	}
	for name := range allowed {
		_, exists := pkgs[name]
		pending := slices.Contains(notYetMerged, name)
		switch {
		case !exists && !pending:
			t.Errorf("the import table has a row for %s, which is not a package of the module: remove the row", name)
		case exists && pending:
			t.Errorf("package %s exists: remove it from notYetMerged", name)
		}
	}
}

func TestLayeringRules(t *testing.T) {
	pkgs := listModule(t)
	for _, r := range linkRules {
		found := false
		for name, p := range pkgs {
			if !matches(r.pkg, name) {
				continue
			}
			found = true
			for _, dep := range p.Deps {
				if matchesAny(r.never, short(dep)) {
					t.Errorf("package %s links %s: %s", name, short(dep), r.why)
				}
			}
		}
		if !found {
			t.Errorf("link rule for %s names no package of the module", r.pkg)
		}
	}
	for _, r := range pureRules {
		p, ok := pkgs[r.pkg]
		if !ok {
			t.Errorf("purity rule for %s names no package of the module", r.pkg)
			continue
		}
		for _, imp := range p.Imports {
			if isStd(imp) && matchesAny(impure, imp) && !slices.Contains(r.allow, imp) {
				t.Errorf("package %s imports %s: %s", r.pkg, imp, r.why)
			}
		}
	}
}
