package kvevents

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestParseConfigDefaultsToMapEncoding: without event_encoding, events are
// published as maps, the form vLLM 0.32's own decoder requires.
func TestParseConfigDefaultsToMapEncoding(t *testing.T) {
	cfg, err := ParseConfig(`{"enable_kv_cache_events": true}`)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.EventEncoding != EncodingMap {
		t.Errorf("default event encoding %s, want map", cfg.EventEncoding)
	}
}

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		want    *Config
		wantErr string
	}{
		{
			name: "vLLM's example binds and takes vLLM's defaults",
			json: `{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv@10.0.0.5@llama"}`,
			want: &Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://*:5557", ReplayEndpoint: "tcp://*:5558", Topic: "kv@10.0.0.5@llama",
				BufferSteps: DefaultBufferSteps, HWM: DefaultHWM, MaxQueueSize: DefaultMaxQueueSize},
		},
		{
			name: "enabling alone picks the zmq publisher",
			json: `{"enable_kv_cache_events": true, "buffer_steps": 5, "hwm": 7, "max_queue_size": 9}`,
			want: &Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: DefaultEndpoint, BufferSteps: 5, HWM: 7, MaxQueueSize: 9},
		},
		{
			name: "an endpoint without a wildcard is connected to, as in vLLM",
			json: `{"enable_kv_cache_events": true, "endpoint": "tcp://indexer:5557"}`,
			want: &Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://indexer:5557", BufferSteps: DefaultBufferSteps, HWM: DefaultHWM, MaxQueueSize: DefaultMaxQueueSize, Connect: true},
		},
		{name: "disabled events need no publisher", json: `{"enable_kv_cache_events": false}`},
		{name: "the null publisher publishes nothing", json: `{"enable_kv_cache_events": true, "publisher": "null"}`},
		{name: "an unknown publisher is refused", json: `{"enable_kv_cache_events": true, "publisher": "nats"}`, wantErr: `unknown publisher "nats"`},
		{name: "an unknown field is refused", json: `{"enable_kv_cache_events": true, "endpoit": "tcp://*:1"}`, wantErr: "unknown field"},
		{name: "an ipc endpoint is refused", json: `{"enable_kv_cache_events": true, "endpoint": "ipc:///tmp/kv"}`, wantErr: "only tcp://"},
		{name: "a bad replay endpoint is refused", json: `{"enable_kv_cache_events": true, "replay_endpoint": "tcp://*"}`, wantErr: "replay_endpoint"},
		{name: "a zero queue is refused", json: `{"enable_kv_cache_events": true, "max_queue_size": 0}`, wantErr: "max_queue_size"},
		{name: "not JSON is refused", json: `enable`, wantErr: "JSON shape"},
		{
			name: "max_subscribers bounds the sockets' connections",
			json: `{"enable_kv_cache_events": true, "max_subscribers": 8}`,
			want: &Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: DefaultEndpoint, BufferSteps: DefaultBufferSteps, HWM: DefaultHWM, MaxQueueSize: DefaultMaxQueueSize, MaxSubscribers: 8},
		},
		{
			name: "event_encoding array publishes events positionally",
			json: `{"enable_kv_cache_events": true, "event_encoding": "array"}`,
			want: &Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: DefaultEndpoint, BufferSteps: DefaultBufferSteps, HWM: DefaultHWM, MaxQueueSize: DefaultMaxQueueSize, EventEncoding: EncodingArray},
		},
		{
			name: "event_encoding map is the default spelled out",
			json: `{"enable_kv_cache_events": true, "event_encoding": "map"}`,
			want: &Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: DefaultEndpoint, BufferSteps: DefaultBufferSteps, HWM: DefaultHWM, MaxQueueSize: DefaultMaxQueueSize, EventEncoding: EncodingMap},
		},
		{name: "an unknown event_encoding is refused", json: `{"enable_kv_cache_events": true, "event_encoding": "positional"}`, wantErr: `unknown event_encoding "positional"`},
		{name: "a numeric event_encoding is refused", json: `{"enable_kv_cache_events": true, "event_encoding": 1}`, wantErr: "event_encoding"},
		{name: "a negative max_subscribers is refused", json: `{"enable_kv_cache_events": true, "max_subscribers": -1}`, wantErr: "max_subscribers"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseConfig(tc.json)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseConfig error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}
