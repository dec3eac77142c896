package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Running the proxy: the backends' health checks (CheckHealth, and
// runHealth's loop), readiness, and Serve, which runs the server beside the
// health loop, the backends file's watch, the scrape and the planner, and
// shuts them down in order when its context ends.

// CheckHealth checks every backend once, concurrently, and returns when all
// checks are done.
func (p *Proxy) CheckHealth(ctx context.Context) {
	var wg sync.WaitGroup
	for _, pl := range []*pool{p.prefill, p.decode} {
		for _, b := range pl.list() {
			wg.Go(func() { checkBackend(ctx, p.client, b, p.cfg.HealthTimeout, p.cfg.BackendAPIKey, p.log) })
		}
	}
	wg.Wait()
}

// Ready reports whether the proxy can serve: a decode backend is healthy,
// and so is a prefill backend, unless it lists none and Fallback is on,
// it was started with none, or the planner may have chosen none (decodes
// only, the colocated split: every request is served on a decode, as a
// colocated engine, and was served while /health said 503). With
// prefills listed but none healthy it is not ready.
func (p *Proxy) Ready() bool {
	if !p.decode.anyHealthy() {
		return false
	}
	return p.prefill.anyHealthy() || ((p.cfg.Fallback || p.colocated()) && len(p.prefill.list()) == 0)
}

// runHealth checks the backends now and then every HealthInterval until ctx
// is done.
func (p *Proxy) runHealth(ctx context.Context) {
	t := time.NewTicker(p.cfg.HealthInterval)
	defer t.Stop()
	for {
		p.CheckHealth(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// shutdownGrace is how long Serve lets open requests finish once ctx is done.
const shutdownGrace = 10 * time.Second

// Serve serves on ln and checks backend health in the background until ctx
// is done; then it stops accepting, gives open requests shutdownGrace to
// finish, closes the rest and returns nil. It returns the server's error if
// serving fails for another reason.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler: p,
		// No ReadTimeout or WriteTimeout: both would cut long streams. The
		// body read and each relayed chunk get their own deadlines instead.
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
	}
	hctx, stopHealth := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { p.runHealth(hctx) })
	if p.cfg.BackendsFile != "" {
		wg.Go(func() { p.watchBackendsFile(hctx) })
	}
	if p.cfg.ScrapeInterval > 0 {
		wg.Go(func() { p.runScrape(hctx) })
	}
	if p.plan != nil {
		wg.Go(func() { p.runPlanner(hctx) })
	}
	defer func() {
		stopHealth()
		wg.Wait()
		p.releaseConversations()
		p.bg.Wait()
		p.client.CloseIdleConnections()
	}()

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("proxy server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("proxy server: %w", err)
	}
	return nil
}
