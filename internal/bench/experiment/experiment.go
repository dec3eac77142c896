package experiment

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/bench/workload"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/progress"
)

// Common is what every experiment is given.
type Common struct {
	// Executable is the tandem binary started as the engines and proxies.
	Executable string
	// Model is the model directory the engines serve.
	Model string
	// Out is the directory for the report, JSON and plots; the processes'
	// logs go to Out/logs.
	Out string
	// EngineArgs are appended to every engine's `tandem serve` command line.
	EngineArgs []string
	// Stdout receives the report as it is written, Log the progress lines.
	// Default os.Stdout, and Progress's writer or else os.Stderr.
	Stdout, Log io.Writer
	// Progress, when set, shows each benchmark level's requests as they
	// run (and the soak's load).
	Progress *progress.Display
}

// Workload is one of the experiments' workloads (chat or long, as package
// workload defines them): the arrival rates to run it at and its SLO.
type Workload struct {
	Name  string
	Rates []float64
	SLO   bench.SLO
}

// experiment is the state shared by the drivers: its processes, how it
// builds plans, and the failures so far.
type experiment struct {
	*procs
	model      string
	goal       float64
	requests   int
	rounds     int
	seed       uint64
	maxContext int
	timeout    time.Duration
	// nextLevel is the first prompt level of the next run: every run (a
	// tuning run, a workload's rates and rounds) takes levels of its own,
	// so none repeats another's prompts.
	nextLevel int
	// failed lists the levels with failed requests, tuning included.
	failed []string
	// progress shows the levels as they run (nil: not at all).
	progress *progress.Display
}

// checkGoal says what is wrong with a goal outside (0, 1].
func checkGoal(goal float64) error {
	if goal <= 0 || goal > 1 {
		return fmt.Errorf("--goal %v: want a fraction in (0, 1]", goal)
	}
	return nil
}

// newExperiment creates OUT/logs and prepares the processes of c.
func newExperiment(c *Common, goal float64) (*experiment, error) {
	p, err := newProcs(c, "experiment")
	if err != nil {
		return nil, err
	}
	return &experiment{procs: p, model: c.Model, goal: goal, progress: c.Progress}, nil
}

// defaults fills in c's writers.
func (c *Common) defaults() {
	c.Stdout = cmp.Or[io.Writer](c.Stdout, os.Stdout)
	if c.Log == nil && c.Progress != nil {
		c.Log = c.Progress.Writer()
	}
	c.Log = cmp.Or[io.Writer](c.Log, os.Stderr)
}

// noteFailures records the levels of s (named what) with failed requests,
// with their most frequent error.
func (x *experiment) noteFailures(s *bench.Suite, what string) {
	for _, r := range s.Results {
		if r.Failed > 0 {
			f := fmt.Sprintf("%d of %s's requests at %s (%s)", r.Failed, r.Target, r.Load, what)
			if len(r.Errors) > 0 {
				f += ": " + r.Errors[0].Error
			}
			x.failed = append(x.failed, f)
		}
	}
}

// writeFailures lists the failed levels, if any, under the report.
func (x *experiment) writeFailures(w io.Writer) {
	if len(x.failed) == 0 {
		return
	}
	fmt.Fprintf(w, "\nFAILED requests (they count as SLO misses above; see %s):\n", x.logDir())
	for _, f := range x.failed {
		fmt.Fprintf(w, "  %s\n", f)
	}
}

// failure is the experiment's error when requests failed, else nil.
func (x *experiment) failure() error {
	if len(x.failed) == 0 {
		return nil
	}
	return fmt.Errorf("requests failed: %s (see the report and the logs directory in %s)", strings.Join(x.failed, "; "), x.out)
}

// maxNumSeqs is the engines' --max-num-seqs: from the engine arguments,
// else tandem serve's default.
func (x *experiment) maxNumSeqs() int {
	n := 64
	for i, a := range x.extra {
		v, ok := strings.CutPrefix(a, "--max-num-seqs=")
		if !ok && a == "--max-num-seqs" && i+1 < len(x.extra) {
			v, ok = x.extra[i+1], true
		}
		if k, err := strconv.Atoi(v); ok && err == nil && k > 0 {
			n = k
		}
	}
	return n
}

func loadsOf(rates []float64) []bench.Load {
	var ls []bench.Load
	for _, r := range rates {
		ls = append(ls, bench.Load{Rate: r, Burstiness: 1})
	}
	return ls
}

// runWorkload builds the workload (prompt ids from the model's tokenizer)
// and runs it against every target.
func (x *experiment) runWorkload(ctx context.Context, targets []bench.Target, wl Workload, loads []bench.Load, rounds, requests int) (*bench.Suite, error) {
	p, err := x.plan(ctx, targets, wl, loads, rounds, requests)
	if err != nil {
		return nil, err
	}
	return bench.Run(ctx, p)
}

// plan builds the workload's plan against targets (prompt ids from the
// model's tokenizer), its levels numbered after every earlier run's.
func (x *experiment) plan(ctx context.Context, targets []bench.Target, wl Workload, loads []bench.Load, rounds, requests int) (*bench.Plan, error) {
	p := &bench.Plan{Targets: targets, Model: filepath.Base(x.model), Loads: loads, Rounds: rounds, Seed: x.seed, Timeout: x.timeout,
		SLO: wl.SLO, Goal: x.goal, Progress: x.progress}
	src := &bench.WorkloadSource{Spec: workload.Spec{Kind: wl.Name, Requests: requests, Seed: x.seed, MaxContext: x.maxContext}, Tokenizer: x.model}
	if err := bench.Prepare(ctx, p, src, x.log); err != nil {
		return nil, err
	}
	p.FirstLevel = x.nextLevel
	x.nextLevel += p.Levels()
	return p, nil
}

// secret is the KV secret the engines share: the environment's, else a
// fresh one.
func secret() string { return cmp.Or(os.Getenv(kvxfer.SecretEnv), kvxfer.GenerateSecret()) }

// finish ends a P/D experiment: stops every process, reports the failed
// requests, and writes the summary (with them) and the report into the
// output directory (report is read after w's last lines, which it
// receives too); the error is the experiment's failure, if any.
func (x *experiment) finish(w io.Writer, summary *PDSummary, report *strings.Builder) error {
	x.stopAll()
	x.writeFailures(w)
	summary.Failed = x.failed
	if err := bench.WriteJSONFile(filepath.Join(x.out, "summary.json"), summary); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(x.out, "report.txt"), []byte(report.String()), 0o644); err != nil {
		return err
	}
	return x.failure()
}
