package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/tandem-serve/tandem/internal/launch"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/proxy"
)

func runUp(args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return up(ctx, args, os.Stdout, os.Stderr)
}

// up is tandem up with args until ctx is done, its endpoint and examples
// on stdout, the engines' and the proxy's logs on stderr.
func up(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tandem up", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tandem up [flags] [-- extra flags for every engine's tandem serve]\n\n"+
			"Starts prefill and decode engines (tandem serve) and the proxy in front of them, and supervises the\n"+
			"engines: one that exits while serving is logged and started again on its ports and cores after a\n"+
			"backoff (--restart-backoff, doubling up to 30s). Meanwhile the proxy routes around it: to another\n"+
			"engine of its role, or, with no prefill up, the decode prefills the prompt itself. The engines run\n"+
			"with --kv-load-failure-policy recompute, so a decode whose prefill died computes the lost KV. An\n"+
			"engine that needs more than --restart-limit restarts within --restart-window stops everything:\n"+
			"tandem up exits 1 naming it. SIGINT or SIGTERM stops the proxy, then the engines (which drain),\n"+
			"and exits 0. With --slo-ttft and --slo-tpot the planner sizes the pools: every engine serves both roles and\n"+
			"the proxy moves engines between prefill and decode as the traffic asks, each finishing its old work\n"+
			"in the background (tandem plan shows why). --prefill 0 starts the colocated split: every engine a decode\n"+
			"that prefills its own prompts, the planner (when on) free to move engines into a prefill pool from there.\n"+
			"See docs/usage/serve.md.\n\n")
		fs.PrintDefaults()
	}
	cfg := launch.Config{Stdout: stdout, Stderr: stderr}
	fs.StringVar(&cfg.ModelDir, "model", "", "Hugging Face Llama/Mistral/Qwen2 model directory (default: the embedded stories260K story model, written once to the user cache)")
	fs.StringVar(&cfg.ServedModelName, "served-model-name", "", "model name in the API (default: the model directory's name)")
	fs.IntVar(&cfg.Prefill, "prefill", 1, "number of prefill engines; 0 is the colocated split, every engine a decode that prefills its own prompts (not with --pd-decider always); with the planner, the split at start, which it may move engines into a prefill pool from")
	fs.IntVar(&cfg.Decode, "decode", 1, "number of decode engines (at least 1; with the planner, the split at start)")
	fs.StringVar(&cfg.Host, "host", "127.0.0.1", "address of the proxy and the engines")
	fs.IntVar(&cfg.Port, "port", 8000, "proxy port")
	fs.IntVar(&cfg.ThreadsPerEngine, "threads-per-engine", 0, "cores per engine (default: this process's cores split evenly)")
	fs.DurationVar(&cfg.StartupTimeout, "startup-timeout", 0, "limit on waiting for every engine to be healthy (default 10m)")
	fs.StringVar(&cfg.APIKey, "api-key", "", "require Authorization: Bearer <key> from clients of the proxy, and from the proxy at the engines (default: $"+openai.APIKeyEnv+")")
	fs.StringVar(&cfg.Policy, "policy", proxy.DefaultPolicy, "the proxy's routing policy: "+strings.Join(proxy.Policies(), ", ")+" (see docs/usage/routing.md)")
	fs.StringVar(&cfg.PDDecider, "pd-decider", proxy.DefaultPDDecider, "the proxy's disaggregation decider: always, conditional (remote prefill only for long uncached prompts) or priced (remote or local by the engines' measured costs; see tandem proxy --pd-decider)")
	fs.DurationVar(&cfg.PDTTFTObjective, "pd-ttft-slo", 0, "priced decider: the time to first token a request should meet (tandem proxy --pd-ttft-slo; default 2s, with --slo-ttft that)")
	fs.DurationVar(&cfg.PDTPOTObjective, "pd-tpot-slo", 0, "priced decider: the time per output token the decodes' streams should meet (tandem proxy --pd-tpot-slo; default 100ms, with --slo-tpot that)")
	fs.BoolVar(&cfg.KVBidirectional, "kv-bidirectional", false, "multi-turn KV reuse: start every engine with --kv-bidirectional and the proxy in conversation mode (requests name a conversation with a conversation_id body field or an X-Conversation-Id header)")
	fs.IntVar(&cfg.Restart.Limit, "restart-limit", launch.DefaultRestartLimit, "restarts of one engine allowed within --restart-window; the next exit stops everything (0: never restart, the first exit stops everything)")
	fs.DurationVar(&cfg.Restart.Window, "restart-window", launch.DefaultRestartWindow, "the sliding window --restart-limit counts an engine's restarts in")
	fs.DurationVar(&cfg.Restart.Backoff, "restart-backoff", launch.DefaultRestartBackoff, "wait before restarting an engine that exited; doubles with each restart within --restart-window, up to 30s")
	fs.DurationVar(&cfg.FirstByteTimeout, "first-byte-timeout", 0, "the proxy's limit on a leg's first byte, then retried on another engine or answered 504 (tandem proxy --first-byte-timeout; default 1m)")
	fs.DurationVar(&cfg.StallTimeout, "stall-timeout", 0, "the proxy's limit on each gap between a decode's chunks, then the stream is cut (tandem proxy --stall-timeout; default 30s)")
	plan := registerPlannerFlags(fs)
	fs.DurationVar(&cfg.PlanInterval, "plan-interval", 0, "planner: the period of its decisions (default 5s)")
	var simulate simulateFlag
	fs.Var(&simulate, "simulate", "start simulated engines (tandem serve --simulate): alone, the built-in time model; --simulate PROFILE.json, a profile from tandem profile. Many fit on one machine: tandem up --simulate --prefill 100 --decode 100. More --sim-* flags go after --")
	var otlp string
	registerOTLPFlag(fs, &otlp)
	args = joinSimulateArg(args)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Simulate = string(simulate)
	var err error
	if cfg.Planner, err = plan.config(); err != nil {
		return err
	}
	switch {
	case cfg.Restart.Limit < 0:
		return fmt.Errorf("--restart-limit %d: want 0 (never restart) or more", cfg.Restart.Limit)
	case cfg.Restart.Limit == 0:
		cfg.Restart.Limit = -1 // launch.RestartPolicy's "never"
	}
	if cfg.APIKey == "" {
		cfg.APIKey = os.Getenv(openai.APIKeyEnv)
	}
	// Extra engine flags come only after "--" (which flag drops), so that a
	// mistyped up flag is an error here rather than in every engine.
	if rest := fs.Args(); len(rest) > 0 {
		if i := len(args) - len(rest) - 1; i < 0 || args[i] != "--" {
			return fmt.Errorf("unexpected argument %q: engine flags go after --, e.g. tandem up -- --block-size 32", rest[0])
		}
		cfg.ExtraArgs = rest
	}
	if otlp != "" {
		// The engines trace to the same collector (the OTEL_* variables
		// reach them through the environment).
		cfg.ExtraArgs = append([]string{"--otlp-traces-endpoint", otlp}, cfg.ExtraArgs...)
	}
	stopTracing, err := startTracing(otlp, "tandem-proxy")
	if err != nil {
		return err
	}
	defer stopTracing()
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the tandem executable to start engines with: %w", err)
	}
	cfg.Executable = exe
	return launch.Run(ctx, cfg)
}
