package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tandem-serve/tandem/internal/gguf"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/progress"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// runModelQuantize is `tandem model quantize DIR --type T --out FILE.gguf`:
// a Hugging Face checkpoint (safetensors) to a GGUF file with its tokenizer
// and chat template in the metadata.
func runModelQuantize(args []string) error {
	fs := flag.NewFlagSet("model quantize", flag.ContinueOnError)
	typ := fs.String("type", "", "weight encoding: "+strings.Join(model.GGUFEncodings, ", ")+" (q4_k_m: Q4_K with Q6_K for the output matrix and half of attn_v/ffn_down, as llama.cpp's Q4_K_M)")
	out := fs.String("out", "", "the GGUF file to write")
	name := fs.String("name", "", "general.name (default: the directory's name)")
	threads := fs.Int("threads", 0, "quantizing threads (default: all CPUs)")
	var pf progress.Flags
	pf.Register(fs)
	// The directory may come before the flags, as the usage writes it.
	var dir string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		dir, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if dir == "" && fs.NArg() == 1 {
		dir = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return fmt.Errorf("quantize: unexpected arguments %q", fs.Args())
	}
	switch {
	case dir == "":
		return errors.New("quantize: give the Hugging Face model directory to convert")
	case *typ == "":
		return fmt.Errorf("quantize: --type is required (%s)", strings.Join(model.GGUFEncodings, ", "))
	case *out == "":
		return errors.New("quantize: --out FILE.gguf is required")
	case *threads < 0:
		return fmt.Errorf("quantize: --threads must be at least 1, got %d", *threads)
	}
	start := time.Now()
	sum, err := quantizeDir(dir, *out, model.GGUFOptions{Encoding: *typ, Name: *name, Threads: *threads}, pf.New(os.Stderr))
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s (%s) in %.1fs: %s\n", *out, strings.ToLower(*typ), time.Since(start).Seconds(), describeSummary(sum))
	return nil
}

// quantizeDir converts dir to a GGUF file at out with dir's tokenizer,
// writing a temporary file next to out and renaming it when complete, its
// progress on d.
func quantizeDir(dir, out string, opts model.GGUFOptions, d *progress.Display) (*model.GGUFSummary, error) {
	if !slices.Contains(model.GGUFEncodings, strings.ToLower(opts.Encoding)) {
		return nil, fmt.Errorf("quantize: unknown --type %q (want one of %s)", opts.Encoding, strings.Join(model.GGUFEncodings, ", "))
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("quantize: %s is not a model directory (config.json, *.safetensors, tokenizer.json)", dir)
	}
	cfg, err := model.LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	if opts.Metadata, err = tokenizer.GGUFMetadata(dir, cfg.Vocab); err != nil {
		return nil, fmt.Errorf("quantize: the tokenizer: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".*")
	if err != nil {
		return nil, fmt.Errorf("quantize: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	qp := newQuantizeProgress(d, cmp.Or(opts.Name, filepath.Base(filepath.Clean(dir))), strings.ToLower(opts.Encoding))
	qp.options(&opts)
	sum, err := model.ConvertToGGUF(dir, tmp, opts)
	qp.done()
	if cerr := tmp.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("quantize: %w", cerr)
	}
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return nil, fmt.Errorf("quantize: %w", err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return nil, fmt.Errorf("quantize: %w", err)
	}
	return sum, nil
}

// describeSummary lists the tensor types written, the most bytes first.
func describeSummary(s *model.GGUFSummary) string {
	types := make([]gguf.Type, 0, len(s.Tensors))
	var total int64
	for t := range s.Tensors {
		types = append(types, t)
		total += s.Bytes[t]
	}
	sort.Slice(types, func(i, j int) bool { return s.Bytes[types[i]] > s.Bytes[types[j]] })
	parts := make([]string, len(types))
	for i, t := range types {
		parts[i] = fmt.Sprintf("%s ×%d (%s)", t, s.Tensors[t], humanBytes(s.Bytes[t]))
	}
	return fmt.Sprintf("%s of tensors: %s", humanBytes(total), strings.Join(parts, ", "))
}

// isGGUFName reports whether a path is meant as a GGUF file.
func isGGUFName(path string) bool { return strings.EqualFold(filepath.Ext(path), ".gguf") }

// initGGUF writes a random-weight model of a named shape as one GGUF file:
// the checkpoint modelinit writes (bf16, or the encoding itself for f32 and
// f16) in a temporary directory, converted; its progress on d.
func initGGUF(shape, enc, out string, seed uint64, d *progress.Display) error {
	enc = strings.ToLower(enc)
	if !slices.Contains(model.GGUFEncodings, enc) {
		return fmt.Errorf("init: unknown --dtype %q (want bf16, f16 or f32 for a directory, or one of %s for a GGUF file)", enc, strings.Join(model.GGUFEncodings, ", "))
	}
	if !isGGUFName(out) {
		return fmt.Errorf("init: --dtype %s writes a GGUF file: give --out FILE.gguf", enc)
	}
	src := "bf16"
	if enc == "f32" || enc == "f16" {
		src = enc
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), ".tandem-init-*")
	if err != nil {
		return fmt.Errorf("init: %w", err)
	}
	defer os.RemoveAll(tmp)
	spec, err := initWeights(tmp, shape, src, seed, d)
	if err != nil {
		return err
	}
	sum, err := quantizeDir(tmp, out, model.GGUFOptions{Encoding: enc, Name: shape}, d)
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s (%s, %s parameters) to %s: %s\n", shape, enc, humanCount(spec.NumParams()), out, describeSummary(sum))
	return nil
}

// ggufRows describes a GGUF file for `model inspect`.
func ggufRows(path string) ([][2]string, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	count := map[gguf.Type]int{}
	for _, t := range f.Tensors {
		count[t.Type]++
	}
	types := make([]string, 0, len(count))
	for t, n := range count {
		types = append(types, fmt.Sprintf("%s ×%d", t, n))
	}
	sort.Strings(types)
	tok, _, _ := f.Str("tokenizer.ggml.model")
	if pre, ok, _ := f.Str("tokenizer.ggml.pre"); ok {
		tok += ", pre-tokenizer " + pre
	}
	if tok == "" {
		tok = "none"
	}
	rows := [][2]string{
		{"format", fmt.Sprintf("GGUF v%d, %d tensors: %s", f.Version, len(f.Tensors), strings.Join(types, ", "))},
		{"tokenizer", tok},
	}
	if name, ok, _ := f.Str("general.name"); ok {
		rows = append(rows, [2]string{"name", name})
	}
	if tmpl, _, _ := f.Str("tokenizer.chat_template"); tmpl != "" {
		rows = append(rows, [2]string{"chat template", fmt.Sprintf("yes (%d bytes)", len(tmpl))})
	}
	return rows, nil
}
