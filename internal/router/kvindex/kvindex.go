// Package kvindex plugs the engines' KV cache events (package kvevents: vLLM's
// wire format over ZMQ, a Subscriber keeping an Index of block hash →
// engines) into the router's prefix scorer, as a precise prefix.Index: an
// engine's prefix hit is then the blocks it reported storing and has not
// reported removing, not the router's guess (for an engine with hybrid
// KV-cache groups, the prefix its own rule would use: every full group's
// blocks and each sliding group's window, see kvevents.Index). Block
// hashes are the engines' own (kvevents.BlockHashes over the prompt's
// token ids, keyed by the model fingerprint; for vLLM engines, a
// "vllm:sha256_cbor" fingerprint and kvevents.VLLMBlockHashes), so the
// router needs the model's tokenizer.
//
// The package is wired by cmd/tandem, not imported by package proxy:
// kvevents computes hashes with the KV cache's code, which links the model
// packages the router's binary otherwise does without.
package kvindex

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/tandem-serve/tandem/internal/kvevents"
	"github.com/tandem-serve/tandem/internal/router/scorer/prefix"
)

// Precise is a prefix.Index fed by KV events.
type Precise struct {
	idx         *kvevents.Index
	sub         *kvevents.Subscriber
	fingerprint string
	blockSize   int
	// vllmSeed is set when the engines are vLLM's (fingerprint
	// "vllm:sha256_cbor[:SEED]"): the seed of their first parent hash.
	vllmSeed *string
}

// VLLMFingerprint is the prefix of a fingerprint naming vLLM engines'
// block hashes instead of Tandem's: "vllm:sha256_cbor" for engines started
// with `--prefix-caching-hash-algo sha256_cbor` and no PYTHONHASHSEED,
// "vllm:sha256_cbor:SEED" for engines with PYTHONHASHSEED=SEED.
const VLLMFingerprint = "vllm:"

// CheckFingerprint reports whether fingerprint can key the index: a Tandem
// engine's fingerprint, or a vLLM hash scheme this package reproduces.
func CheckFingerprint(fingerprint string) error {
	_, err := vllmSeed(fingerprint)
	return err
}

// vllmSeed returns the NONE_HASH seed of a "vllm:" fingerprint, nil for a
// Tandem fingerprint.
func vllmSeed(fingerprint string) (*string, error) {
	rest, ok := strings.CutPrefix(fingerprint, VLLMFingerprint)
	if !ok {
		return nil, nil
	}
	algo, seed, hasSeed := strings.Cut(rest, ":")
	if algo != "sha256_cbor" {
		return nil, fmt.Errorf("model fingerprint %q: vLLM's %q block hashes cannot be reproduced outside Python; start the vLLM engines with --prefix-caching-hash-algo sha256_cbor and give vllm:sha256_cbor (or vllm:sha256_cbor:SEED with their PYTHONHASHSEED)", fingerprint, algo)
	}
	if !hasSeed {
		seed = kvevents.VLLMDefaultHashSeed
	}
	return &seed, nil
}

var _ prefix.Index = (*Precise)(nil)

// New returns an index for engines serving the model with fingerprint, in
// blocks of blockSize tokens, following no engine yet. A fingerprint
// starting with VLLMFingerprint names vLLM engines' hash scheme (check it
// first with CheckFingerprint; an unknown scheme hashes as Tandem does).
func New(fingerprint string, blockSize int, log *slog.Logger) *Precise {
	seed, _ := vllmSeed(fingerprint)
	idx := kvevents.NewIndex()
	if seed != nil {
		idx = kvevents.NewIndexWithRule(kvevents.VLLMWindows)
	}
	return &Precise{idx: idx, sub: kvevents.NewSubscriber(idx, kvevents.SubscriberOptions{Logger: log}), fingerprint: fingerprint, blockSize: blockSize, vllmSeed: seed}
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

// Hash returns the engines' chained block hashes of a prompt's token ids:
// Tandem's (kvevents.BlockHashes), or vLLM's for a "vllm:" fingerprint
// (kvevents.VLLMBlockHashes).
func (p *Precise) Hash(ids []int32) []uint64 {
	if p.vllmSeed != nil {
		return kvevents.VLLMBlockHashes(*p.vllmSeed, p.blockSize, ids)
	}
	return kvevents.BlockHashes(p.fingerprint, p.blockSize, ids)
}

// Stats returns what the subscriber saw of an engine.
func (p *Precise) Stats(backend string) (kvevents.EngineStats, bool) { return p.sub.Stats(backend) }

// Close stops following the engines.
func (p *Precise) Close() { p.sub.Close() }

// Unfollow stops following a backend's KV events and drops what the index
// holds for it (the backend was removed from the pool).
func (p *Precise) Unfollow(backend string) { p.sub.Remove(backend) }

// Pattern derives a decode's KV-event endpoints from its backend URL, for
// decodes that join the pool at run time (the backends file, the admin
// endpoint, Kubernetes discovery): "tcp://{host}:5557;tcp://{host}:5558"
// is the PUB socket and, after ';', the replay socket (optional). {host} is
// the backend URL's host, {port} its port and {port+N} / {port-N} that port
// plus or minus N, so that engines sharing a host with their event ports at
// a fixed offset from their HTTP port can be followed too.
type Pattern struct {
	pub, replay string
}

var portRef = regexp.MustCompile(`\{port([+-][0-9]+)?\}`)

// ParsePattern parses a pattern, checking that it expands to tcp://
// endpoints.
func ParsePattern(s string) (*Pattern, error) {
	pub, replay, _ := strings.Cut(strings.TrimSpace(s), ";")
	pt := &Pattern{pub: strings.TrimSpace(pub), replay: strings.TrimSpace(replay)}
	if pt.pub == "" {
		return nil, errors.New("KV events pattern: empty; want tcp://{host}:PORT[;tcp://{host}:PORT]")
	}
	for _, e := range []string{pt.pub, pt.replay} {
		// The syntax only: ports are checked against each backend's.
		out := portRef.ReplaceAllString(strings.ReplaceAll(e, "{host}", "h"), "1")
		if e != "" && (!strings.HasPrefix(out, "tcp://") || strings.ContainsAny(out, "{}")) {
			return nil, fmt.Errorf("KV events pattern %q: want tcp://HOST:PORT with only {host}, {port}, {port±N}", e)
		}
	}
	return pt, nil
}

// Expand returns the PUB and replay endpoints of the engine at backend.
func (pt *Pattern) Expand(backend string) (pub, replay string, err error) {
	u, err := url.Parse(backend)
	if err != nil || u.Hostname() == "" {
		return "", "", fmt.Errorf("KV events pattern: backend %q has no host", backend)
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	httpPort, _ := strconv.Atoi(port)
	host := u.Hostname()
	if strings.Contains(host, ":") {
		host = "[" + host + "]" // IPv6
	}
	expand := func(s string) (string, error) {
		if s == "" {
			return "", nil
		}
		var perr error
		out := portRef.ReplaceAllStringFunc(strings.ReplaceAll(s, "{host}", host), func(ref string) string {
			n := httpPort
			if m := portRef.FindStringSubmatch(ref); m[1] != "" {
				off, _ := strconv.Atoi(m[1])
				n += off
			}
			if n < 1 || n > 65535 {
				perr = fmt.Errorf("KV events pattern %q: port %d of backend %s is out of range", s, n, backend)
			}
			return strconv.Itoa(n)
		})
		if perr != nil {
			return "", perr
		}
		if !strings.HasPrefix(out, "tcp://") || strings.ContainsAny(out, "{}") {
			return "", fmt.Errorf("KV events pattern %q: expands to %q for %s; want tcp://HOST:PORT with only {host}, {port}, {port±N}", s, out, backend)
		}
		return out, nil
	}
	if pub, err = expand(pt.pub); err != nil {
		return "", "", err
	}
	if replay, err = expand(pt.replay); err != nil {
		return "", "", err
	}
	return pub, replay, nil
}

// Endpoints is one engine's KV-event sockets (replay "" for none).
type Endpoints struct{ Pub, Replay string }

// Follower keeps the index following the decode pool as it changes: a
// decode added is followed at the endpoints given for it, else at its
// pattern's, and a decode removed is unfollowed. Its BackendsChanged is
// the proxy's Config.BackendsChanged.
type Follower struct {
	idx      *Precise
	pattern  *Pattern // nil: only the explicit engines are followed
	explicit map[string]Endpoints
	log      *slog.Logger

	mu       sync.Mutex
	followed map[string]Endpoints
}

// NewFollower returns a Follower of idx; explicit maps normalized backend
// URLs to their endpoints, pattern (nil for none) derives the others'.
func NewFollower(idx *Precise, explicit map[string]Endpoints, pattern *Pattern, log *slog.Logger) *Follower {
	if log == nil {
		log = slog.Default()
	}
	return &Follower{idx: idx, pattern: pattern, explicit: explicit, log: log, followed: map[string]Endpoints{}}
}

// BackendsChanged follows the decodes added and unfollows those removed;
// other roles are ignored (only the decode pool is matched by prefix).
func (f *Follower) BackendsChanged(role string, added, removed []string) {
	if role != "decode" {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range removed {
		if _, ok := f.followed[b]; ok {
			delete(f.followed, b)
			f.idx.Unfollow(b)
			f.log.Info("stopped following a removed decode's KV events", "backend", b)
		}
	}
	for _, b := range added {
		if err := f.follow(b); err != nil {
			f.log.Warn("not following a decode's KV events; its prefix hits are unknown to the router", "backend", b, "err", err)
		}
	}
}

// Follow follows one decode at its explicit endpoints or its pattern's; a
// decode with neither, or already followed there, is left alone (nil
// error).
func (f *Follower) Follow(backend string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.follow(backend)
}

func (f *Follower) follow(backend string) error {
	ep, ok := f.explicit[backend]
	if !ok {
		if f.pattern == nil {
			return nil
		}
		var err error
		if ep.Pub, ep.Replay, err = f.pattern.Expand(backend); err != nil {
			return err
		}
	}
	if cur, ok := f.followed[backend]; ok && cur == ep {
		return nil
	}
	if err := f.idx.Follow(backend, ep.Pub, ep.Replay, ""); err != nil {
		return err
	}
	f.followed[backend] = ep
	f.log.Info("following a decode's KV events", "backend", backend, "endpoint", ep.Pub, "replay", ep.Replay)
	return nil
}
