package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/tandem-serve/tandem/internal/proxy"
)

// urlList is a flag holding a comma-separated list of URLs; repeating the
// flag appends.
type urlList []string

func (l *urlList) String() string { return strings.Join(*l, ",") }

func (l *urlList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

func runProxy(args []string) error {
	fs := flag.NewFlagSet("tandem proxy", flag.ContinueOnError)
	var cfg proxy.Config
	var prefill, decode urlList
	fs.Var(&prefill, "prefill", "prefill engine URL(s), comma-separated or repeated (required)")
	fs.Var(&decode, "decode", "decode engine URL(s), comma-separated or repeated (required)")
	host := fs.String("host", "127.0.0.1", "address to listen on")
	port := fs.Int("port", 8000, "port to listen on")
	fs.StringVar(&cfg.Policy, "policy", "round-robin", "backend picking policy: "+strings.Join(proxy.Policies(), ", "))
	fs.BoolVar(&cfg.Fallback, "fallback", true, "when the prefill leg fails, let decode do the whole request (said in the x-tandem-pd header); false fails such requests instead")
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "limit on the prefill leg, on waiting for decode's headers and on each gap between decode's chunks (default 5m)")
	fs.DurationVar(&cfg.ConnectTimeout, "connect-timeout", 0, "limit on connecting to a backend (default 5s)")
	fs.DurationVar(&cfg.HealthInterval, "health-interval", 0, "period of backend health checks (default 2s)")
	fs.Int64Var(&cfg.MaxBodyBytes, "max-body-bytes", 0, "largest accepted request body (default 16 MiB)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if len(prefill) == 0 || len(decode) == 0 {
		return errors.New("give the engines with --prefill URL[,URL...] and --decode URL[,URL...]")
	}
	cfg.Prefill, cfg.Decode = prefill, decode
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg.Logger = log
	p, err := proxy.New(cfg)
	if err != nil {
		return err
	}
	addr := net.JoinHostPort(*host, strconv.Itoa(*port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w (is another server using the port? choose one with --port)", addr, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("proxy listening", "addr", "http://"+ln.Addr().String(), "prefill", cfg.Prefill, "decode", cfg.Decode, "policy", cfg.Policy)
	return p.Serve(ctx, ln)
}
