package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/tandem-serve/tandem/internal/router"
)

// Two endpoints the proxy answers without routing: /health (the backends'
// states and readiness) and /v1/models (relayed from a healthy decode
// backend).

// healthBody is the JSON answer of /health.
type healthBody struct {
	Status  string         `json:"status"` // "ok" or "unavailable"
	Prefill []backendState `json:"prefill"`
	Decode  []backendState `json:"decode"`
}

func (p *Proxy) handleHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeError(w, http.StatusMethodNotAllowed, "use GET /health")
		return
	}
	body := healthBody{Status: "ok", Prefill: p.prefill.states(), Decode: p.decode.states()}
	status := http.StatusOK
	if !p.Ready() {
		body.Status = "unavailable"
		status = http.StatusServiceUnavailable
	}
	b, _ := json.MarshalIndent(body, "", "  ")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// handleModels relays a healthy decode backend's /v1/models: the decode
// engines are the ones that answer the client, so theirs is the truth.
func (p *Proxy) handleModels(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		writeError(w, http.StatusMethodNotAllowed, "use GET /v1/models")
		return
	}
	b, done, _ := p.decode.pick(&router.Request{Path: r.URL.Path}, 0)
	if b != nil {
		defer done()
	}
	if b == nil {
		writeError(w, http.StatusServiceUnavailable, "no healthy decode backend; see /health")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.base+"/v1/models", nil)
	if err != nil {
		p.writeInternalError(w, "", "building the /v1/models call", err)
		return
	}
	p.setBackendHeaders(req.Header, r.Header)
	resp, err := p.client.Do(req)
	if err != nil {
		if r.Context().Err() == nil {
			markDown(b, err, p.log)
		}
		writeError(w, http.StatusBadGateway, fmt.Sprintf("decode backend %s: %v", b.base, err))
		return
	}
	defer resp.Body.Close()
	copyResponseHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, io.LimitReader(resp.Body, p.cfg.MaxBodyBytes))
}
