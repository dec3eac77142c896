package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvconnector"
	"github.com/tandem-serve/tandem/internal/openai"
)

// How an engine drains when Run's context ends (`tandem serve` ends it on
// SIGTERM or SIGINT), for Kubernetes and any other orchestrator that stops
// a pod with a signal and a grace period:
//
//  1. Readiness fails at once: /health answers 503 (the router stops
//     sending new requests on its first failed probe, an EndpointSlice
//     marks the pod unready), and new generation requests get an
//     OpenAI-shaped 503 that a router retries elsewhere. Liveness (/livez)
//     stays 200, and /metrics and /tandem/kv/release keep working.
//  2. Requests in flight, queued ones included, run to the end for up to
//     --shutdown-timeout; what is left then is aborted.
//  3. A prefill (role prefill or both, or --kv-bidirectional) keeps its
//     side channel serving the KV it holds for decode legs until each hold
//     is read (the decode's DONE) or its lease ends, and at most until
//     max(--shutdown-timeout, --kv-lease) after the signal; a decode's
//     conversation holds are given up at once. The engine exits as soon as
//     nothing is left, not at the bound.
//  4. The HTTP server closes once the engine stopped, giving handlers up
//     to httpGrace to write their last bytes.
//
// Run returns nil when nothing had to be cut short, an error otherwise
// (`tandem serve` exits 0 or 1). A second signal during the drain is the
// command's to handle: it exits at once.

// httpGrace is how long handlers of finished requests get to write their
// last bytes to slow clients once the engine has stopped.
const httpGrace = 5 * time.Second

// drainBound is the longest the engine part of a drain may take: requests
// get --shutdown-timeout, and an engine that holds KV for remote decodes
// keeps it up to --kv-lease beyond the signal. A pod's
// terminationGracePeriodSeconds should be a few seconds above it.
func drainBound(cfg *Config, conn *kvconnector.Connector) time.Duration {
	if conn.ServesKV() {
		return max(cfg.ShutdownTimeout, conn.Lease())
	}
	return cfg.ShutdownTimeout
}

// drain runs steps 1-4 above and returns what was cut short, if anything.
func drain(log *slog.Logger, cfg *Config, api *openai.Server, eng *engine.Engine, conn *kvconnector.Connector, srv *http.Server) error {
	api.Drain() // readiness first: nothing below may delay it
	start := time.Now()
	bound := drainBound(cfg, conn)
	log.Info("draining: /health answers 503 and new requests get 503 (/livez stays 200); requests in flight finish; held KV is served until read or its lease ends; a second signal exits at once",
		"requests_in_flight", api.InFlight(), "engine_requests", eng.InFlight(),
		"kv_holds", conn.HeldRequests(), "kv_held_blocks", conn.HeldBlocks(),
		"shutdown_timeout", cfg.ShutdownTimeout, "max_drain", bound)

	reqCtx, cancelReq := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancelReq()
	holdCtx, cancelHold := context.WithTimeout(context.Background(), bound)
	defer cancelHold()
	engErr := eng.Drain(reqCtx, holdCtx)

	// Handlers of finished requests may still be writing to their clients.
	httpDeadline := start.Add(cfg.ShutdownTimeout)
	if d := time.Now().Add(httpGrace); d.After(httpDeadline) {
		httpDeadline = d
	}
	hctx, cancelHTTP := context.WithDeadline(context.Background(), httpDeadline)
	defer cancelHTTP()
	httpErr := srv.Shutdown(hctx)
	if httpErr != nil {
		httpErr = errors.Join(fmt.Errorf("http server: answers still being written were cut: %w", httpErr), srv.Close())
	}
	err := errors.Join(engErr, httpErr)
	took := time.Since(start).Round(time.Millisecond)
	if err != nil {
		log.Warn("drained, cutting work short", "took", took, "err", err)
	} else {
		log.Info("drained: every request finished and every KV hold was read or expired", "took", took)
	}
	return err
}
