// Package kvevents publishes an engine's KV cache events in vLLM's KV-events
// wire format, and keeps a router's index of which engine holds which block
// from them: the "precise" prefix-cache signal of prefix-aware routing.
//
// # Publishing (the engine)
//
// A Publisher is the engine's kvcache.CacheObserver: the prefix cache
// reports each block it registers (BlockStored, with the block's parent hash
// and token ids) and each block it stops caching (BlockRemoved: evicted for
// new content, or dropped as invalid). The step loop calls Flush once per
// step; the step's events become one KVEventBatch, handed to the publishing
// goroutine through a bounded queue that never blocks the loop (a full
// queue drops the batch and counts it). The publishing goroutine numbers the
// batch, encodes it, keeps it in a ring of the last buffer_steps batches and
// queues it for each subscriber (up to hwm messages each; beyond, that
// subscriber misses it). Close publishes AllBlocksCleared.
//
// The wire format is vLLM's (vllm/distributed/kv_events.py,
// ZmqEventPublisher), so consumers of vLLM's events (llm-d's kv-cache
// indexer, Dynamo's router, vLLM's own KVEventBatch decoder) index Tandem
// engines unchanged, as long as they read the event form published: maps
// with a "type" key by default, as vLLM 0.32 writes them, or the positional
// form older vLLM wrote ("event_encoding": "array"):
//
//   - a ZMQ PUB socket (endpoint, default tcp://*:5557) sending three-frame
//     messages [topic, sequence number as 8 bytes big-endian, payload],
//     sequence numbers counting batches from 0 per process;
//   - the payload a msgpack KVEventBatch [ts, [event...], data_parallel_rank]
//     of msgspec's tagged events, laid out field for field in events.go: by
//     default maps, as vLLM 0.32 writes them ({"type": "BlockStored",
//     "block_hashes": ..., "parent_block_hash": ..., "token_ids": ...,
//     "block_size": ..., "lora_id": nil, "medium": ..., "lora_name": nil},
//     {"type": "BlockRemoved", "block_hashes": ..., "medium": ...},
//     {"type": "AllBlocksCleared"}), or with event_encoding "array" the
//     same values positionally, as older vLLM wrote them (["BlockStored",
//     block_hashes, ...], ["BlockRemoved", ...], ["AllBlocksCleared"]);
//   - a ZMQ ROUTER socket (replay_endpoint) answering a request ["", start
//     sequence] with one message ["", seq, payload] per batch it still
//     keeps from start on, then ["", -1, ""].
//
// --kv-events-config takes vLLM's JSON (ParseConfig), plus Tandem's
// max_subscribers (a bound on the sockets' connections, default 64). The
// sockets are package zmtp's (the ZMTP 3.x subset: NULL mechanism,
// PUB/SUB and ROUTER/DEALER framing; its doc says why it is not a library);
// this package adds only vLLM's semantics: batching, sequence numbers, the
// replay ring and its request format. msgpack's primitives are
// github.com/tinylib/msgp's runtime (no generated code): the schema, with
// msgspec's tagged unions, is spelled out by hand in events.go and
// decode.go, and msgpack.go holds the glue.
//
// # Block hashes
//
// A block hash is the engine's own prefix-cache key (kvcache.BlockHash):
// SHA-256 chained over the parent block's hash, the block's token ids and
// the model fingerprint. On the wire it is its last 8 bytes read big-endian,
// the integer form vLLM publishes its own SHA-256 block hashes in by default
// (WireHash). vLLM's hashes are its own too, so a router cannot compute them
// from another system's formula: it must compute what the engine computes.
// BlockHashes does exactly that, from the prompt's token ids, the engine's
// block size and the model fingerprint (engine.Forwarder.Fingerprint). The
// token ids travel in BlockStored as well, for indexers (llm-d's) that hash
// tokens themselves. For vLLM engines VLLMBlockHashes computes what vLLM
// publishes when started with --prefix-caching-hash-algo sha256_cbor (its
// default, sha256, hashes Python pickles, which only Python reproduces).
//
// # Subscribing and the index (the router)
//
// A Subscriber follows N engines' PUB sockets and applies their batches in
// sequence order to an Index. A gap in the sequence (a message past a
// high-water mark, a batch dropped by a busy engine) is filled from the
// engine's replay socket; batches no replay can give back clear that
// engine's entries, since their removals may be missing. On every
// connection the subscriber replays from the last batch it applied: the
// same batch coming back unchanged proves the same engine process, anything
// else means it restarted, and its entries are cleared before its history
// is replayed from sequence 0. Index.Match returns, per engine, how many
// leading blocks of a request it holds; an engine's AllBlocksCleared, its
// restart or its removal from the Subscriber clears its entries.
//
// The decoder faces the network: it checks every length against the bytes
// left, bounds nesting, skips unknown fields and event types, and accepts
// both event forms (maps, as vLLM writes them since its PR #42892, and
// arrays), so the same Subscriber indexes vLLM engines of either era.
package kvevents
