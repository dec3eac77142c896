package server

import (
	"errors"
	"syscall"

	"github.com/tandem-serve/tandem/internal/kvconnector"
	"github.com/tandem-serve/tandem/internal/kvxfer"
)

// kvPort is the port the side channel listens on: Config.KVPort, or, with
// KVPortFallback, 0 (a free one) when KVPort is taken. The connector
// advertises whatever port it bound, so decode engines follow either way.
//
// It probes by listening and closing: another process could take the port
// between the probe and the connector's listen, and the engine then stops
// with the error naming --kv-port, as without the fallback.
func (s *Server) kvPort() int {
	cfg := &s.cfg
	listens := cfg.Role != kvconnector.RoleDecode || cfg.KVBidirectional
	if !cfg.KVPortFallback || cfg.KVPort == 0 || !listens {
		return cfg.KVPort
	}
	ln, err := kvxfer.Listen(cfg.KVHost, cfg.KVPort)
	if err == nil {
		ln.Close()
		return cfg.KVPort
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		s.log.Warn("kv side-channel port in use (another engine on this host?): listening on a free port instead, advertised to decode engines in kv_transfer_params; pass --kv-port to fix one",
			"kv_host", cfg.KVHost, "kv_port", cfg.KVPort)
		return 0
	}
	return cfg.KVPort // the connector reports the error
}
