package kvevents

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Config is vLLM's KVEventsConfig (vllm/config/kv_events.py) as
// --kv-events-config spells it in JSON, with vLLM's defaults.
type Config struct {
	// EnableKVCacheEvents turns publishing on.
	EnableKVCacheEvents bool `json:"enable_kv_cache_events"`
	// Publisher is "zmq" or "null"; empty means "zmq" when enabled.
	Publisher string `json:"publisher"`
	// Endpoint is the PUB socket's address. As in vLLM, one with "*" or
	// "::" in it is bound (tcp://*:5557), any other is connected to, for a
	// subscriber that binds (llm-d's centralized indexer).
	Endpoint string `json:"endpoint"`
	// ReplayEndpoint, if set, is bound to a ROUTER socket that answers
	// "events from sequence N" out of the last BufferSteps batches.
	ReplayEndpoint string `json:"replay_endpoint"`
	// BufferSteps is the number of batches kept for replay.
	BufferSteps int `json:"buffer_steps"`
	// HWM is the number of messages queued for one subscriber before
	// messages to it are dropped (ZMQ's high-water mark).
	HWM int `json:"hwm"`
	// MaxQueueSize is the number of batches the engine may queue for the
	// publisher goroutine before batches are dropped.
	MaxQueueSize int `json:"max_queue_size"`
	// Topic is the first frame of every message; subscribers filter on
	// its prefix.
	Topic string `json:"topic"`
	// MaxSubscribers bounds the connections the PUB socket, and the
	// replay socket, accept at once (0: DefaultMaxSubscribers); one more
	// is closed on accept. It is Tandem's: vLLM's libzmq sockets take any
	// number of peers, and vLLM's KVEventsConfig has no such field.
	MaxSubscribers int `json:"max_subscribers"`
	// EventEncoding is the form events are published in: "map" (the
	// default; vLLM 0.32's, which vLLM's own decoder requires) or "array"
	// (the positional form older vLLM published). It is Tandem's: vLLM
	// publishes the one form its version has.
	EventEncoding Encoding `json:"event_encoding"`

	// Connect is whether Endpoint is dialed rather than bound; ParseConfig
	// sets it by vLLM's rule.
	Connect bool `json:"-"`
}

// vLLM's defaults.
const (
	DefaultEndpoint     = "tcp://*:5557"
	DefaultBufferSteps  = 10_000
	DefaultHWM          = 100_000
	DefaultMaxQueueSize = 100_000
)

// DefaultMaxSubscribers is Tandem's default for max_subscribers.
const DefaultMaxSubscribers = 64

// ParseConfig parses --kv-events-config. It returns nil, nil when events
// are disabled (enable_kv_cache_events false, or publisher "null").
// Unknown fields are refused, and so is any publisher but "zmq" and "null".
func ParseConfig(s string) (*Config, error) {
	cfg := Config{Endpoint: DefaultEndpoint, BufferSteps: DefaultBufferSteps, HWM: DefaultHWM, MaxQueueSize: DefaultMaxQueueSize}
	d := json.NewDecoder(bytes.NewReader([]byte(s)))
	d.DisallowUnknownFields()
	if err := d.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("--kv-events-config: %w (want vLLM's JSON shape, e.g. {\"enable_kv_cache_events\": true, \"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\", \"topic\": \"kv@host@model\"})", err)
	}
	if d.More() {
		return nil, errors.New("--kv-events-config: trailing data after the JSON object")
	}
	switch cfg.Publisher {
	case "":
		cfg.Publisher = "null"
		if cfg.EnableKVCacheEvents {
			cfg.Publisher = "zmq"
		}
	case "zmq", "null":
	default:
		return nil, fmt.Errorf("--kv-events-config: unknown publisher %q: Tandem publishes with \"zmq\" (or \"null\" for none)", cfg.Publisher)
	}
	if !cfg.EnableKVCacheEvents || cfg.Publisher == "null" {
		return nil, nil
	}
	if cfg.BufferSteps < 0 || cfg.HWM < 0 || cfg.MaxQueueSize <= 0 {
		return nil, fmt.Errorf("--kv-events-config: buffer_steps %d, hwm %d and max_queue_size %d must not be negative (max_queue_size positive)", cfg.BufferSteps, cfg.HWM, cfg.MaxQueueSize)
	}
	if cfg.MaxSubscribers < 0 {
		return nil, fmt.Errorf("--kv-events-config: max_subscribers %d must not be negative (0 takes the default, %d)", cfg.MaxSubscribers, DefaultMaxSubscribers)
	}
	if _, err := tcpAddr(cfg.Endpoint); err != nil {
		return nil, fmt.Errorf("--kv-events-config: endpoint: %w", err)
	}
	cfg.Connect = !strings.Contains(cfg.Endpoint, "*") && !strings.Contains(cfg.Endpoint, "::")
	if cfg.ReplayEndpoint != "" {
		if _, err := tcpAddr(cfg.ReplayEndpoint); err != nil {
			return nil, fmt.Errorf("--kv-events-config: replay_endpoint: %w", err)
		}
	}
	return &cfg, nil
}

// tcpAddr turns a ZMQ tcp:// endpoint into a Go address: "*" is every
// interface.
func tcpAddr(ep string) (string, error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", fmt.Errorf("%q: only tcp:// endpoints are supported (ipc:// and inproc:// are not)", ep)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", fmt.Errorf("%q: %w", ep, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return "", fmt.Errorf("%q: bad port %q", ep, port)
	}
	if host == "*" {
		host = ""
	}
	return net.JoinHostPort(host, port), nil
}
