package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Backends is what discovery feeds: the complete current list of engines
// of a role. The Proxy implements it; a static list, the watched file
// (Config.BackendsFile), the admin endpoint and, later, Kubernetes discovery
// all go through it.
type Backends interface {
	SetBackends(role string, urls []string) error
}

var _ Backends = (*Proxy)(nil)

// AdminBackendsPath is the admin route for the backend set: GET lists it,
// PUT replaces a role's list, POST adds one backend, DELETE removes one. It
// needs the proxy's API key; without one configured it is refused, since
// anyone could otherwise point the proxy at engines of their choosing.
const AdminBackendsPath = "/tandem/admin/backends"

// SetBackends makes urls the backends of role ("prefill" or "decode"). New
// backends are health-checked at once and receive requests when healthy.
func (p *Proxy) SetBackends(role string, urls []string) error {
	pl, err := p.poolOf(role)
	if err != nil {
		return err
	}
	added, removed, err := pl.update(urls)
	if err != nil {
		return err
	}
	for _, b := range removed {
		p.prefix.Forget(b.base)
		p.log.Info("backend removed", "role", role, "backend", b.base)
	}
	if p.cfg.BackendsChanged != nil && len(added)+len(removed) > 0 {
		p.cfg.BackendsChanged(role, basesOf(added), basesOf(removed))
	}
	if len(added) > 0 {
		var wg sync.WaitGroup
		for _, b := range added {
			p.log.Info("backend added", "role", role, "backend", b.base)
			wg.Go(func() {
				checkBackend(context.Background(), p.client, b, p.cfg.HealthTimeout, p.cfg.BackendAPIKey, p.log)
			})
		}
		wg.Wait()
	}
	return nil
}

func basesOf(bs []*backend) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.base
	}
	return out
}

func (p *Proxy) poolOf(role string) (*pool, error) {
	switch role {
	case rolePrefill:
		return p.prefill, nil
	case roleDecode:
		return p.decode, nil
	}
	return nil, fmt.Errorf("role %q: want prefill or decode", role)
}

// urlsOf lists pl's backend URLs (an empty list, never nil: the admin
// GET answers [] for an empty pool).
func urlsOf(pl *pool) []string {
	out := []string{}
	for _, b := range pl.list() {
		out = append(out, b.base)
	}
	return out
}

// adminBackend is the body of POST and DELETE; adminList the body of PUT
// and GET's answer.
type adminBackend struct {
	Role string `json:"role"`
	URL  string `json:"url"`
}

type adminList struct {
	Prefill []string `json:"prefill"`
	Decode  []string `json:"decode"`
}

func (p *Proxy) handleAdminBackends(w http.ResponseWriter, r *http.Request) {
	if !p.key.Enabled() {
		writeError(w, http.StatusForbidden, "the admin endpoint needs the proxy to be started with --api-key")
		return
	}
	if r.Method != http.MethodGet && p.cfg.PlannerAct {
		writeError(w, http.StatusConflict, "the planner moves engines between the pools (--planner-act): it owns them, so "+AdminBackendsPath+" only lists them; restart the proxy without --planner-act to edit them")
		return
	}
	var err error
	switch r.Method {
	case http.MethodGet:
	case http.MethodPut:
		var l adminList
		if err = decodeAdmin(r, &l); err == nil {
			if err = p.SetBackends(rolePrefill, l.Prefill); err == nil {
				err = p.SetBackends(roleDecode, l.Decode)
			}
		}
	case http.MethodPost, http.MethodDelete:
		var one adminBackend
		if err = decodeAdmin(r, &one); err == nil {
			var pl *pool
			if pl, err = p.poolOf(one.Role); err == nil {
				var base string
				if base, err = normalizeURL(one.URL); err == nil {
					urls := urlsOf(pl)
					if r.Method == http.MethodPost && !slices.Contains(urls, base) {
						urls = append(urls, base)
					}
					if r.Method == http.MethodDelete {
						urls = slices.DeleteFunc(urls, func(u string) bool { return u == base })
					}
					err = p.SetBackends(one.Role, urls)
				}
			}
		}
	default:
		writeError(w, http.StatusMethodNotAllowed, "use GET, PUT, POST or DELETE "+AdminBackendsPath)
		return
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	b, _ := json.Marshal(adminList{Prefill: urlsOf(p.prefill), Decode: urlsOf(p.decode)})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

func decodeAdmin(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("admin body: %w", err)
	}
	return nil
}

// parseBackendsFile reads "prefill URL" / "decode URL" lines.
func parseBackendsFile(data []byte) (prefill, decode []string, err error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return nil, nil, fmt.Errorf("line %d: want \"prefill URL\" or \"decode URL\"", n)
		}
		switch f[0] {
		case rolePrefill:
			prefill = append(prefill, f[1])
		case roleDecode:
			decode = append(decode, f[1])
		default:
			return nil, nil, fmt.Errorf("line %d: role %q: want prefill or decode", n, f[0])
		}
	}
	return prefill, decode, sc.Err()
}

// loadBackendsFile applies Config.BackendsFile.
func (p *Proxy) loadBackendsFile() error {
	data, err := os.ReadFile(p.cfg.BackendsFile)
	if err != nil {
		return fmt.Errorf("backends file: %w", err)
	}
	pre, dec, err := parseBackendsFile(data)
	if err != nil {
		return fmt.Errorf("backends file %s: %w", p.cfg.BackendsFile, err)
	}
	if err := p.SetBackends(rolePrefill, pre); err != nil {
		return fmt.Errorf("backends file %s: %w", p.cfg.BackendsFile, err)
	}
	if err := p.SetBackends(roleDecode, dec); err != nil {
		return fmt.Errorf("backends file %s: %w", p.cfg.BackendsFile, err)
	}
	return nil
}

// watchBackendsFile reloads Config.BackendsFile when its modification time
// or size changes, until ctx is done. A file that fails to parse is logged
// and ignored: the last good set stays.
func (p *Proxy) watchBackendsFile(ctx context.Context) {
	var lastMod time.Time
	var lastSize int64 = -1
	if fi, err := os.Stat(p.cfg.BackendsFile); err == nil {
		lastMod, lastSize = fi.ModTime(), fi.Size()
	}
	t := time.NewTicker(p.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fi, err := os.Stat(p.cfg.BackendsFile)
		if err != nil || (fi.ModTime().Equal(lastMod) && fi.Size() == lastSize) {
			continue
		}
		lastMod, lastSize = fi.ModTime(), fi.Size()
		if err := p.loadBackendsFile(); err != nil {
			p.log.Warn("backends file not applied; keeping the current backends", "err", err)
		}
	}
}
