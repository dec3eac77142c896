package server

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/hugemem"
	"github.com/tandem-serve/tandem/internal/model"
	"github.com/tandem-serve/tandem/internal/sim"
	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/tokenizer"
)

// loadForwarder returns the engine's forward pass: the model in cfg.Model
// on a pool of cfg.Threads workers, or, with cfg.Simulate, a simulated
// model shaped by its config.json and tokenizer. The returned function
// releases it.
func loadForwarder(cfg *Config, tok *tokenizer.Tokenizer, log *slog.Logger) (engine.Forwarder, func(), error) {
	if cfg.Simulate == nil {
		pool := tensor.NewPool(cfg.Threads)
		m, err := model.LoadWith(cfg.Model, pool, model.LoadOptions{Progress: cfg.LoadProgress})
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		logWeightPages(log, m)
		return m, func() { m.Close(); pool.Close() }, nil
	}
	c := cfg.Simulate
	tm, err := c.timeModel()
	if err != nil {
		return nil, nil, err
	}
	mc, err := model.LoadConfig(cfg.Model)
	if err != nil {
		return nil, nil, err
	}
	gen, err := model.LoadGenerationConfig(cfg.Model)
	if err != nil {
		return nil, nil, err
	}
	// A simulated model has no position limit of its own: --max-model-len
	// may exceed the tokenizer's model's.
	maxLen := mc.MaxModelLen()
	if cfg.MaxModelLen > 0 {
		maxLen = cfg.MaxModelLen
	}
	eos := tok.EOS()
	for _, id := range append(gen.EOS, mc.EOS...) {
		if !slices.Contains(eos, id) {
			eos = append(eos, id)
		}
	}
	m, err := sim.New(sim.Config{
		Vocab: max(mc.Vocab, tok.VocabSize()), Choices: textTokens(tok), MaxModelLen: maxLen, EOS: eos, Generation: *gen,
		KVCacheDType: cfg.KVCacheDType, Seed: c.Seed, MeanOutputLen: c.MeanOutputLen, Time: tm, Speed: c.Speed,
		Faults: c.Faults, Logger: log,
	})
	if err != nil {
		return nil, nil, err
	}
	log.Info("simulated model", "time_model", c.describe(), "speed", c.Speed, "seed", c.Seed, "fingerprint", m.Fingerprint())
	if c.OnModel != nil {
		c.OnModel(m)
	}
	return m, func() { m.Close() }, nil
}

// logWeightPages logs how much of the weights' memory is in transparent
// huge pages and, when little is, why and what the operator can do (see
// pagesAdvice).
func logWeightPages(log *slog.Logger, m *model.Model) {
	total, huge, ok := m.WeightPages()
	if !ok {
		return
	}
	mode := hugemem.Mode()
	log.Info("model weights in memory", "bytes", total, "in_huge_pages", huge, "thp", mode, "as_panels", m.PanelMemory())
	if advice := pagesAdvice(total, huge, mode); advice != "" {
		log.Info(advice)
	}
}

// pagesAdvice says, when under half of total bytes of weights are in huge
// pages, why and which setting decides it under THP mode mode; "" otherwise.
// Decode streams every weight once a token, and 4 KiB pages cost one-thread
// decode 8–12% on a Zen 4 (docs/performance.md, "Model load").
func pagesAdvice(total, huge int64, mode string) string {
	if huge >= total/2 {
		return ""
	}
	switch mode {
	case "never":
		return "transparent huge pages are off (/sys/kernel/mm/transparent_hugepage/enabled is never): decode reads the weights faster in huge pages; set it to madvise to let Tandem use them"
	case "madvise", "always":
		return "the kernel gave the weights few huge pages (memory fragmented?): decode reads them faster in huge pages; /sys/kernel/mm/transparent_hugepage/defrag decides whether a fault compacts memory for one"
	}
	return ""
}

// timeModel is the simulation's time model: its knobs, the built-in
// profile, or its profile file.
func (c *Simulation) timeModel() (sim.TimeModel, error) {
	switch {
	case c.Knobs != nil:
		return *c.Knobs, nil
	case c.Profile == "":
		return sim.DefaultProfile(), nil
	}
	return sim.LoadProfile(c.Profile)
}

// describe names the time model for the log.
func (c *Simulation) describe() string {
	switch {
	case c.Knobs != nil:
		return fmt.Sprintf("knobs ttft=%v itl=%v prefill_per_token=%v", c.Knobs.TTFT, c.Knobs.ITL, c.Knobs.PrefillPerToken)
	case c.Profile == "":
		return "built-in profile"
	}
	return "profile " + c.Profile
}

// textTokens are the ids of tok's ordinary tokens: not special, and
// decoding on their own to printable text (not a byte-fallback piece of a
// character, not a control character, not only spaces).
func textTokens(tok *tokenizer.Tokenizer) []int32 {
	var ids []int32
	for id := range int32(tok.VocabSize()) {
		t := tok.Decode([]int32{id}, true)
		if tok.IsSpecial(id) || strings.TrimSpace(t) == "" || !utf8.ValidString(t) || strings.ContainsFunc(t, func(r rune) bool { return r < ' ' || r == utf8.RuneError }) {
			continue
		}
		ids = append(ids, id)
	}
	return ids
}
