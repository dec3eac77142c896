// Package engine runs one model's serving loop: requests come in through
// Submit, a single step-loop goroutine owns the scheduler (package sched) and
// the KV pool (package kvcache), and each step it
//
//  1. drains incoming messages (submits, aborts, KV connector completions,
//     a new prefill cadence from SetPrefillScheduleInterval),
//  2. asks the scheduler what to compute (decodes first, then prefill chunks),
//  3. lets the KV connector's worker half start this step's loads,
//  4. runs model.Forward over the whole batch,
//  5. samples each request that reached the end of its known tokens,
//     detokenizes incrementally and checks EOS, stop tokens, stop strings,
//     min_tokens and max_tokens,
//  6. hands each request's new tokens and text to its Handle, and
//  7. reports the results back to the scheduler.
//
// Nothing else touches scheduler or pool state: other goroutines talk to the
// loop only by message. The loop never blocks on a slow client: tokens a
// client has not picked up yet are merged into its next Event. When nothing
// is runnable the loop sleeps on its inbox.
//
// Drain (and Shutdown, its one-deadline form) is the graceful stop: Submit
// refuses at once, requests in flight finish until the request deadline
// (then they are aborted), and blocks a KV connector holds for another
// engine (a prefill's KV a remote decode has not read) are kept until the
// connector releases them or the hold deadline passes; only then does the
// loop stop and the connector close, so a prefill's side channel serves
// held KV to the end.
package engine
