// Package picker defines how the proxy chooses one backend of a pool for a
// request. A policy is a Picker; each policy lives in its own folder below
// this one (roundrobin, and later least-load or prefix-aware ones) and is made
// by name through the proxy's policy factory, so adding a policy touches
// neither the proxy's request flow nor the other policies.
//
// The shape follows the llm-d router's filter → scorer → picker pipeline
// without its framework: the proxy does the one filter every policy needs
// (drop unhealthy backends) and hands the rest to the policy.
package picker

// Endpoint is one healthy backend as a policy sees it: a snapshot taken just
// before Pick is called.
type Endpoint struct {
	// Index is the backend's position in its pool (the order of the --prefill
	// or --decode list). It is stable for the proxy's lifetime, so a policy
	// may keep per-backend state keyed by it.
	Index int
	// URL is the backend's base URL, e.g. "http://127.0.0.1:8100".
	URL string
	// InFlight is the number of requests the proxy has open on the backend.
	InFlight int64
}

// Request is what a policy may look at to choose. Policies must treat it as
// read-only.
type Request struct {
	// Path is the API path, e.g. "/v1/chat/completions".
	Path string
	// ID is the request id shared by the prefill and decode legs.
	ID string
	// Body is the client's JSON body as received.
	Body []byte
}

// Picker chooses one of a pool's healthy endpoints. Pick is called with at
// least one endpoint and returns an index into endpoints; an index out of
// range is treated as 0. A Picker is called from many goroutines at once.
type Picker interface {
	Pick(req *Request, endpoints []Endpoint) int
}
