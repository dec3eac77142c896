package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tandem-serve/tandem/internal/defaultmodel"
	"github.com/tandem-serve/tandem/internal/gguf"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/modelinit"
	"github.com/tandem-serve/tandem/internal/progress"
	"github.com/tandem-serve/tandem/internal/tensor"
)

const modelUsage = `usage:
  tandem model init --shape NAME --out DIR [--dtype bf16|f16|f32] [--seed N]
  tandem model init --shape NAME --out FILE.gguf [--dtype %[2]s] [--seed N]
  tandem model quantize DIR --type %[2]s --out FILE.gguf [--name NAME] [--threads N]
  tandem model inspect [DIR | FILE.gguf]   (none: the embedded default model)

Progress goes to stderr: --progress auto|always|plain|never (auto: a line
redrawn in place on a terminal, plain lines otherwise), --quiet for none.

shapes: %[1]s
`

func printModelUsage() {
	fmt.Fprintf(os.Stderr, modelUsage, strings.Join(modelinit.Shapes(), ", "), strings.Join(model.GGUFEncodings, "|"))
}

// runModel dispatches "tandem model init", "quantize" and "inspect".
func runModel(args []string) error {
	if len(args) == 0 {
		printModelUsage()
		return errors.New("missing subcommand (init, quantize or inspect)")
	}
	switch args[0] {
	case "init":
		return runModelInit(args[1:])
	case "quantize":
		return runModelQuantize(args[1:])
	case "inspect":
		return runModelInspect(args[1:])
	case "-h", "--help", "help":
		printModelUsage()
		return flag.ErrHelp
	}
	return fmt.Errorf("unknown subcommand %q (want init, quantize or inspect)", args[0])
}

func runModelInit(args []string) error {
	fs := flag.NewFlagSet("model init", flag.ContinueOnError)
	shape := fs.String("shape", "", "model shape: "+strings.Join(modelinit.Shapes(), ", "))
	dtype := fs.String("dtype", "bf16", "weight dtype: bf16, f16 or f32; or, written as GGUF, "+strings.Join(model.GGUFEncodings, ", "))
	out := fs.String("out", "", "output directory (created if needed), or FILE.gguf to write one GGUF file")
	seed := fs.Uint64("seed", 0, "random seed; the same seed writes the same files")
	var pf progress.Flags
	pf.Register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *shape == "" || *out == "" || fs.NArg() > 0 {
		fs.Usage()
		return errors.New("init: --shape and --out are required, and no positional arguments are accepted")
	}
	if isGGUFName(*out) || !slices.Contains([]string{"bf16", "f16", "f32"}, *dtype) {
		return initGGUF(*shape, *dtype, *out, *seed, pf.New(os.Stderr))
	}
	spec, err := initWeights(*out, *shape, *dtype, *seed, pf.New(os.Stderr))
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s (%s, %s parameters, %s of weights) to %s\n", *shape, *dtype,
		humanCount(spec.NumParams()), humanBytes(spec.NumParams()*int64(dtypeSize(*dtype))), *out)
	return nil
}

// initWeights is modelinit.Init with the weights' bytes written shown on d.
func initWeights(dir, shape, dtype string, seed uint64, d *progress.Display) (modelinit.Spec, error) {
	r := d.Reporter("writing "+shape+" ("+dtype+")", progress.Bytes)
	defer r.Done()
	return modelinit.InitProgress(dir, shape, dtype, seed, r.Func())
}

func dtypeSize(dtype string) int {
	if dtype == "f32" {
		return 4
	}
	return 2
}

func runModelInspect(args []string) error {
	fs := flag.NewFlagSet("model inspect", flag.ContinueOnError)
	pf := progress.Flags{Delay: loadDelay}
	pf.Register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 1 {
		return errors.New("inspect: want one model directory or GGUF file, or none for the default model")
	}
	dir := fs.Arg(0)
	if dir == "" {
		var err error
		if dir, err = useDefaultModel(os.Stdout); err != nil {
			return err
		}
	}
	pool := tensor.NewPool(1)
	defer pool.Close()
	m, err := loadModel(dir, pool, pf.New(os.Stderr))
	if err != nil {
		return err
	}
	defer m.Close()
	c := m.Config()
	rope := "none"
	switch rs := c.RopeScaling; rs.Type {
	case "linear":
		rope = fmt.Sprintf("linear ×%g", rs.Factor)
	case "llama3":
		rope = fmt.Sprintf("llama3 ×%g (low %g, high %g, original %d)", rs.Factor, rs.LowFreqFactor, rs.HighFreqFactor, rs.OriginalMaxPositionEmbeddings)
	case "freqs":
		rope = "per-frequency factors (GGUF rope_freqs, Llama 3 scaling)"
	case "longrope":
		rope = fmt.Sprintf("longrope, short factors (served up to original %d positions)", rs.OriginalMaxPositionEmbeddings)
	}
	kv := m.KVLayout(1)
	where := "directory"
	var extra [][2]string
	if gguf.IsFile(dir) {
		where = "file"
		if extra, err = ggufRows(dir); err != nil {
			return err
		}
	}
	rows := [][2]string{
		{where, dir},
		{"architecture", c.ModelType},
		{"dtype", m.DType().String()},
		{"layers", fmt.Sprint(c.Layers)},
		{"hidden", fmt.Sprint(c.Hidden)},
		{"heads", fmt.Sprintf("%d query, %d kv, head dim %d", c.Heads, c.KVHeads, c.HeadDim)},
		{"ffn", fmt.Sprint(c.Intermediate)},
		{"vocab", fmt.Sprint(c.Vocab)},
		{"max positions", fmt.Sprint(m.MaxModelLen())},
		{"rope", fmt.Sprintf("theta %g, scaling %s", c.RopeTheta, rope)},
		{"tied embeddings", fmt.Sprint(c.TieWordEmbeddings)},
		{"q/k/v bias", fmt.Sprint(c.QKVBias)},
		{"parameters", fmt.Sprintf("%s (%d)", humanCount(m.NumParams()), m.NumParams())},
		{"weight memory", humanBytes(m.WeightBytes())},
		{"KV per token", fmt.Sprintf("%s (%s KV; --kv-cache-dtype auto)", humanBytes(int64(kv.BlockBytes())), kv.DType)},
		{"fingerprint", m.Fingerprint()},
	}
	rows = append(rows, extra...)
	if notice := filepath.Join(dir, defaultmodel.NoticeFile); fileExists(notice) {
		rows = append(rows, [2]string{"license", notice})
	}
	for _, r := range rows {
		fmt.Printf("%-16s %s\n", r[0]+":", r[1])
	}
	return nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// useDefaultModel writes the embedded default model to the user cache (once)
// and prints to w what it is; the commands that take --model call it when
// none is given.
func useDefaultModel(w io.Writer) (string, error) {
	dir, err := defaultmodel.Install("")
	if err != nil {
		return "", err
	}
	fmt.Fprintln(w, defaultmodel.Describe(dir))
	return dir, nil
}

// withDefaultModel returns the arguments of `tandem serve` with --model set
// to the default model when they set none. It parses them with serve's own
// flags, so that only a real --model counts; arguments that do not parse are
// returned as they are, for parseServeFlags to report.
func withDefaultModel(args []string, w io.Writer) ([]string, error) {
	fs := flag.NewFlagSet("tandem serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	(&serveFlags{}).register(fs)
	if fs.Parse(args) != nil {
		return args, nil
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "model" })
	if given {
		return args, nil
	}
	dir, err := useDefaultModel(w)
	if err != nil {
		return nil, err
	}
	return append([]string{"--model", dir}, args...), nil
}

func humanCount(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
