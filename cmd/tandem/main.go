// Command tandem serves LLMs with disaggregated prefill and decode.
//
// Subcommands: serve (an engine), proxy (the P/D router), up (proxy and
// engines on one machine), bench (serving benchmark), model (init, inspect),
// generate (one-shot generation in the terminal), profile (step times for
// simulated engines).
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
)

type command struct {
	name  string
	usage string
	run   func(args []string) error
}

var commands = []command{
	{"up", "run proxy + prefill + decode engines on this machine", runUp},
	{"serve", "run one engine with an OpenAI-compatible API", runServe},
	{"proxy", "run the disaggregated prefill/decode proxy", runProxy},
	{"plan", "the planner's P:D split and the numbers behind it (a proxy's, or a saved run's)", runPlan},
	{"generate", "generate text from a model in the terminal", runGenerate},
	{"model", "init (random-weight model) | quantize DIR (to GGUF) | inspect DIR|FILE.gguf", runModel},
	{"bench", "serving benchmark against an OpenAI endpoint", runBench},
	{"profile", "measure a model's step times here, for serve --simulate", runProfile},
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: tandem <command> [flags]\n\ncommands:\n")
	for _, c := range commands {
		fmt.Fprintf(os.Stderr, "  %-9s %s\n", c.name, c.usage)
	}
	fmt.Fprintf(os.Stderr, "\nRun 'tandem <command> -h' for a command's flags.\n")
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	name := os.Args[1]
	if name == "-h" || name == "--help" || name == "help" {
		usage()
		return
	}
	for _, c := range commands {
		if c.name == name {
			err := c.run(os.Args[2:])
			if errors.Is(err, flag.ErrHelp) {
				os.Exit(0)
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "tandem %s: %v\n", name, err)
				os.Exit(1)
			}
			return
		}
	}
	fmt.Fprintf(os.Stderr, "tandem: unknown command %q\n\n", name)
	usage()
	os.Exit(2)
}
