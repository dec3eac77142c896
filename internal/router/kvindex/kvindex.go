// Package kvindex plugs the engines' KV cache events (package kvevents: vLLM's
// wire format over ZMQ, a Subscriber keeping an Index of block hash →
// engines) into the router's prefix scorer, as a precise prefix.Index: an
// engine's prefix hit is then the blocks it reported storing and has not
// reported removing, not the router's guess. Block hashes are the engines'
// own (kvevents.BlockHashes over the prompt's token ids, keyed by the model
// fingerprint), so the router needs the model's tokenizer.
//
// The package is wired by cmd/tandem, not imported by package proxy:
// kvevents computes hashes with the KV cache's code, which links the model
// packages the router's binary otherwise does without.
package kvindex

import (
	"log/slog"

	"github.com/tandem-serve/tandem/internal/kvevents"
	"github.com/tandem-serve/tandem/internal/router/scorer/prefix"
)

// Precise is a prefix.Index fed by KV events.
type Precise struct {
	idx         *kvevents.Index
	sub         *kvevents.Subscriber
	fingerprint string
	blockSize   int
}

var _ prefix.Index = (*Precise)(nil)

// New returns an index for engines serving the model with fingerprint, in
// blocks of blockSize tokens, following no engine yet.
func New(fingerprint string, blockSize int, log *slog.Logger) *Precise {
	idx := kvevents.NewIndex()
	return &Precise{idx: idx, sub: kvevents.NewSubscriber(idx, kvevents.SubscriberOptions{Logger: log}), fingerprint: fingerprint, blockSize: blockSize}
}

// Follow subscribes to the KV events of the engine whose proxy backend URL
// is backend (normalized as the proxy does: proxy.NormalizeBackendURL).
// endpoint is its PUB socket ("tcp://host:5557"), replay its replay socket
// ("" for none), topic a prefix filter ("" for all).
func (p *Precise) Follow(backend, endpoint, replay, topic string) error {
	return p.sub.Add(kvevents.Engine{Name: backend, Endpoint: endpoint, ReplayEndpoint: replay, Topic: topic})
}

// Match implements prefix.Index.
func (p *Precise) Match(hashes []uint64, f func(engine string, blocks int)) {
	for _, h := range p.idx.Match(hashes, nil) {
		f(h.Engine, h.Blocks)
	}
}

// Observe implements prefix.Index: the engines' events say what they hold.
func (p *Precise) Observe(string, []uint64) {}

// Hash returns the engines' chained block hashes of a prompt's token ids.
func (p *Precise) Hash(ids []int32) []uint64 {
	return kvevents.BlockHashes(p.fingerprint, p.blockSize, ids)
}

// Stats returns what the subscriber saw of an engine.
func (p *Precise) Stats(backend string) (kvevents.EngineStats, bool) { return p.sub.Stats(backend) }

// Close stops following the engines.
func (p *Precise) Close() { p.sub.Close() }
