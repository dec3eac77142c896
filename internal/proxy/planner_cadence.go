package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tandem-serve/tandem/internal/planner"
)

// The planner's prefill cadence, applied: when the planner acts, the
// engines of the decode pool serve both roles and prefill the prompts the
// conditional decider keeps local beside their decodes, so they run the
// cadence the planner chose (planner.Decision's PrefillScheduleInterval).
// After each decision that fitted the model, every decode-pool engine
// whose cadence differs from the chosen one (each is asked) is set through
// its admin route (cadencePath, with BackendAPIKey), in the background and
// one round at a time. An engine that joins the decode pool later, was
// restarted, or whose call failed, is set at the next decision. The prefill pool is left alone: with
// nothing decoding there the cadence is inert.

// cadencePath is the engines' admin route for the prefill cadence,
// server.CadencePath (checked by a test; the proxy does not import the
// engine).
const cadencePath = "/tandem/admin/prefill-schedule-interval"

// cadenceCallTimeout bounds one call to an engine's cadence route.
const cadenceCallTimeout = 5 * time.Second

// cadenceState is what the proxy has set on the engines.
type cadenceState struct {
	want    atomic.Int64 // the cadence to run; 0 before the first fitted decision
	running atomic.Bool  // a round of calls is under way
	again   atomic.Bool  // a decision came during the round: run another

	mu      sync.Mutex
	applied map[string]int    // engine URL → the cadence it runs, as it last answered
	failed  map[string]string // engine URL → why its last call failed

	sets *prometheus.CounterVec // result: ok, failed
}

// cadenceReport is the cadence part of GET /tandem/plan.
type cadenceReport struct {
	// PrefillScheduleInterval is the cadence the decode pool's engines are
	// set to; 0 before the planner first fitted its model.
	PrefillScheduleInterval int `json:"prefill_schedule_interval"`
	// Applied is each engine's cadence as it last answered it.
	Applied map[string]int `json:"applied"`
	// Failed says why the last call to an engine failed (retried at the
	// next decision).
	Failed map[string]string `json:"failed,omitempty"`
}

// initCadence registers the cadence's metric.
func (s *planState) initCadence(reg prometheus.Registerer) {
	s.cad.applied, s.cad.failed = map[string]int{}, map[string]string{}
	s.cad.sets = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem:planner_cadence_sets_total",
		Help: "The planner's prefill cadence set on decode-pool engines (ok), and calls to their cadence route that failed (failed)."}, []string{"result"})
	reg.MustRegister(s.cad.sets)
}

// cadenceFitted reports whether d's cadence comes from a fitted model: a
// decision held for too few or stale samples carries the default 1, which
// must not override what the engines run.
func cadenceFitted(d planner.Decision) bool { return d.Fit.Current.P+d.Fit.Current.D > 0 }

// applyCadence sets d's cadence on the decode pool's engines that do not
// run it yet, in the background; it returns at once.
func (p *Proxy) applyCadence(d planner.Decision) {
	c := &p.plan.cad
	if !cadenceFitted(d) || d.PrefillScheduleInterval < 1 {
		return
	}
	c.want.Store(int64(d.PrefillScheduleInterval))
	c.again.Store(true)
	if !c.running.CompareAndSwap(false, true) {
		return // the round under way runs another
	}
	p.bg.Go(func() {
		for {
			for c.again.Swap(false) {
				p.cadenceRound(int(c.want.Load()))
			}
			c.running.Store(false)
			// A decision between the last check and the Store above found
			// the round running: take it over unless another did.
			if !c.again.Load() || !c.running.CompareAndSwap(false, true) {
				return
			}
		}
	})
}

// cadenceRound sets n on every decode-pool engine that does not run it,
// concurrently, and forgets engines no longer in either pool. It asks each
// engine what it runs first (a GET), so that one restarted with its flag's
// cadence, or set by hand, is set again.
func (p *Proxy) cadenceRound(n int) {
	c := &p.plan.cad
	decode := p.decode.list()
	live := map[string]bool{}
	for _, b := range append(p.prefill.list(), decode...) {
		live[b.base] = true
	}
	c.mu.Lock()
	for u := range c.applied {
		if !live[u] {
			delete(c.applied, u)
		}
	}
	for u := range c.failed {
		if !live[u] {
			delete(c.failed, u)
		}
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, b := range decode {
		wg.Go(func() {
			cur, err := p.callCadence(b.base, 0)
			set := err == nil && cur != n
			if set {
				_, err = p.callCadence(b.base, n)
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if err != nil {
				c.sets.WithLabelValues("failed").Inc()
				if c.failed[b.base] != err.Error() {
					p.log.Warn("planner: setting the prefill cadence on an engine failed; retried at the next decision",
						"backend", b.base, "prefill_schedule_interval", n, "err", err)
				}
				c.failed[b.base] = err.Error()
				return
			}
			c.applied[b.base] = n
			delete(c.failed, b.base)
			if set {
				c.sets.WithLabelValues("ok").Inc()
				p.log.Info("planner: prefill cadence set", "backend", b.base, "prefill_schedule_interval", n, "previous", cur)
			}
		})
	}
	wg.Wait()
}

// callCadence calls base's cadence route: with n 0 it reads the cadence
// the engine runs (GET), else sets n (POST) and returns the cadence it
// replaced.
func (p *Proxy) callCadence(base string, n int) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cadenceCallTimeout)
	defer cancel()
	method, body := http.MethodGet, ""
	if n > 0 {
		method, body = http.MethodPost, `{"prefill_schedule_interval":`+strconv.Itoa(n)+`}`
	}
	req, err := http.NewRequestWithContext(ctx, method, base+cadencePath, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	if n > 0 {
		req.Header.Set("Content-Type", "application/json")
	}
	setAuth(req.Header, p.cfg.BackendAPIKey)
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		msg := strings.TrimSpace(string(raw))
		if m := errorMessage(raw); m != "" {
			msg = m
		}
		hint := ""
		switch resp.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			hint = " (give the engines and the proxy the same key: --api-key on both, or --backend-api-key)"
		case http.StatusNotFound:
			hint = " (an engine older than the cadence route: upgrade it to follow the planner's cadence)"
		}
		return 0, fmt.Errorf("%s %s answered %s: %s%s", method, base+cadencePath, resp.Status, msg, hint)
	}
	var ans struct {
		Interval int `json:"prefill_schedule_interval"`
		Previous int `json:"previous"`
	}
	if err := json.Unmarshal(raw, &ans); err != nil || ans.Interval < 1 {
		return 0, fmt.Errorf("%s %s: an answer that is not the engine's cadence (%q): is it a Tandem engine?", method, base+cadencePath, raw)
	}
	if n > 0 {
		return ans.Previous, nil
	}
	return ans.Interval, nil
}

// cadenceReport is the cadence part of GET /tandem/plan, nil unless the
// planner acts.
func (p *Proxy) cadenceReport() *cadenceReport {
	if !p.cfg.PlannerAct {
		return nil
	}
	c := &p.plan.cad
	c.mu.Lock()
	defer c.mu.Unlock()
	r := &cadenceReport{PrefillScheduleInterval: int(c.want.Load()), Applied: map[string]int{}}
	for u, n := range c.applied {
		r.Applied[u] = n
	}
	if len(c.failed) > 0 {
		r.Failed = map[string]string{}
		for u, e := range c.failed {
			r.Failed[u] = e
		}
	}
	return r
}

// errorMessage is the message of an OpenAI-shaped error body, "" for any
// other body.
func errorMessage(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(bytes.TrimSpace(body), &e) != nil {
		return ""
	}
	return e.Error.Message
}
