package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/tandem-serve/tandem/internal/apierror"
	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/httpguard"
)

// CadencePath is the engine's admin route for its prefill cadence
// (--prefill-schedule-interval) at run time: GET answers the interval in
// use, POST {"prefill_schedule_interval": N} sets it between two steps
// (the proxy's planner calls it on the engines that prefill beside their
// decodes; the engine logs each change). It takes the engine's API key like every other route; an
// engine started without one takes it only from its own host (`tandem up`'s
// engines, on loopback), since anyone who reaches it could otherwise slow
// its prefills.
const CadencePath = "/tandem/admin/prefill-schedule-interval"

// CadenceRequest is the body of POST CadencePath.
type CadenceRequest struct {
	// PrefillScheduleInterval is the new cadence: 1 (prefill on every
	// step) to engine.MaxPrefillScheduleInterval.
	PrefillScheduleInterval *int `json:"prefill_schedule_interval"`
}

// CadenceResponse is the answer of CadencePath.
type CadenceResponse struct {
	// PrefillScheduleInterval is the cadence in use (after a POST, the new
	// one).
	PrefillScheduleInterval int `json:"prefill_schedule_interval"`
	// Previous is the cadence a POST replaced; absent on GET.
	Previous int `json:"previous,omitempty"`
	// Max is the largest cadence the route accepts.
	Max int `json:"max"`
}

// cadenceSetter is the engine's side of the route.
type cadenceSetter interface {
	PrefillScheduleInterval() int
	SetPrefillScheduleInterval(ctx context.Context, n int) (prev int, err error)
}

// cadenceBodyLimit bounds the route's body: one small JSON object.
const cadenceBodyLimit = 4 << 10

// cadenceTimeout bounds how long a POST waits for the step loop, which
// applies the change between two steps.
const cadenceTimeout = 10 * time.Second

// withCadenceRoute serves CadencePath from eng and everything else from
// api. The route passes package httpguard's checks with the API key
// first, as the API's routes do.
func withCadenceRoute(api http.Handler, eng cadenceSetter, apiKey string) http.Handler {
	key := apierror.NewAPIKey(apiKey)
	h := &cadenceHandler{eng: eng, keyed: key.Enabled()}
	guarded := httpguard.Wrap(h, httpguard.Options{JSONPaths: []string{CadencePath}, Authorize: key.Check})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == CadencePath {
			guarded.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	})
}

type cadenceHandler struct {
	eng   cadenceSetter
	keyed bool // the API key was checked
}

func (h *cadenceHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.keyed && !fromLoopback(r) {
		apierror.WriteError(w, apierror.NewError(http.StatusForbidden, "",
			"this engine has no API key, so it takes run-time settings only from its own host: start it with --api-key (or $%s) and send the key", apierror.APIKeyEnv))
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		writeCadence(w, CadenceResponse{PrefillScheduleInterval: h.eng.PrefillScheduleInterval(), Max: engine.MaxPrefillScheduleInterval})
	case http.MethodPost:
		h.set(w, r)
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		apierror.WriteError(w, apierror.NewError(http.StatusMethodNotAllowed, "", "method %s is not allowed on %s; use GET to read the prefill cadence or POST to set it", r.Method, CadencePath))
	}
}

func (h *cadenceHandler) set(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, cadenceBodyLimit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			apierror.WriteError(w, apierror.NewError(http.StatusRequestEntityTooLarge, "", "the body is over %d bytes: send {\"prefill_schedule_interval\": N}", cadenceBodyLimit))
			return
		}
		apierror.WriteError(w, apierror.BadRequest("", "reading the body: %v", err))
		return
	}
	var req CadenceRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || dec.More() {
		if err == nil {
			err = errors.New("more than one JSON value")
		}
		apierror.WriteError(w, apierror.BadRequest("prefill_schedule_interval", "the body must be {\"prefill_schedule_interval\": N} with N an integer from 1 to %d: %v", engine.MaxPrefillScheduleInterval, err))
		return
	}
	if req.PrefillScheduleInterval == nil {
		apierror.WriteError(w, apierror.BadRequest("prefill_schedule_interval", "prefill_schedule_interval is required: an integer from 1 (prefill on every step) to %d", engine.MaxPrefillScheduleInterval))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), cadenceTimeout)
	defer cancel()
	prev, err := h.eng.SetPrefillScheduleInterval(ctx, *req.PrefillScheduleInterval)
	if err != nil {
		var ire *engine.InvalidRequestError
		switch {
		case errors.As(err, &ire):
			apierror.WriteError(w, apierror.BadRequest(ire.Param, "%s", ire.Message))
		case errors.Is(err, engine.ErrShuttingDown):
			w.Header().Set("Retry-After", "1")
			apierror.WriteError(w, apierror.NewError(http.StatusServiceUnavailable, "", "the engine is shutting down: set the cadence on another engine"))
		default:
			apierror.WriteError(w, apierror.NewError(http.StatusServiceUnavailable, "", "%v; retry", err))
		}
		return
	}
	writeCadence(w, CadenceResponse{PrefillScheduleInterval: *req.PrefillScheduleInterval, Previous: prev, Max: engine.MaxPrefillScheduleInterval})
}

func writeCadence(w http.ResponseWriter, c CadenceResponse) {
	b, _ := json.Marshal(c) // ints always marshal
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

// fromLoopback reports whether r came from this host.
func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}
