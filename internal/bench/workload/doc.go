// Package workload generates the requests of a serving benchmark: their
// prompts (as token ids, so their lengths are exact whatever the server's
// tokenizer), their output lengths, and how they group into conversations.
//
// Every generator is a pure function of its seed, so two targets (or two
// runs) see the same requests in the same order. A workload is a list of
// Conversations; a single-turn request is a conversation of one turn with no
// ID. Arrival times come from package bench's arrival processes, or from the
// trace itself (Trace).
//
// Kinds: fixed lengths and length distributions (Dist: fixed, uniform,
// normal, lognormal, each clamped to [min, max]); Chat, a mix shaped like
// public ShareGPT statistics (heavy-tailed prompts and answers of a few
// hundred tokens); Long (1–2k-token prompts, 100–300-token answers);
// SharedPrefix (groups of requests that start with the same system prompt);
// MultiTurn (conversations whose turns append the previous answer, with
// think time between turns); and ReadTrace, the Mooncake/Azure-style JSONL
// trace (timestamp, input and output length, optional prefix block hashes).
package workload
