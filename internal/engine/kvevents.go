package engine

import "github.com/tandem-serve/tandem/internal/kvcache"

// KVEventSink receives the KV cache events of the engine's prefix cache
// (kvevents.Publisher implements it): the pool reports each block it
// registers or stops caching as it happens, and the step loop calls Flush
// after each step and before it sleeps, so one step's events form one batch.
// All its methods run on the step loop and must never block.
type KVEventSink interface {
	kvcache.CacheObserver
	Flush()
}
