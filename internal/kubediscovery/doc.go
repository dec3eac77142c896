// Package kubediscovery finds the proxy's prefill and decode engines on
// Kubernetes: a Watcher runs one client-go EndpointSlice informer per role
// (a shared informer factory restricted to the namespace and the role's
// label selector; a Service name is the selector
// kubernetes.io/service-name=NAME) and feeds the proxy's dynamic backend set
// (the Backends interface, which *proxy.Proxy implements) with the role's
// ready endpoints.
//
// The set of a role is every address of every ready endpoint (conditions.ready
// true or unset, conditions.terminating not true) of every matching slice,
// on the slices' TCP port of the pool's port name (default "http"), as
// "scheme://host:port" with IPv6 addresses bracketed, sorted and without
// duplicates (an endpoint can sit in two slices while the controller moves
// it). Backends gets the set once the informer has listed the slices, then
// at each change of the set: events that leave it as it was (a slice's
// unrelated field, a relist after a dropped watch) call nothing. A burst of
// events coalesces into one call.
//
// Until the first list succeeds, Backends is left alone, so the static
// backends the proxy started with (if any) keep serving while the API
// server is unreachable; the informer retries with backoff. Once listed, a
// failing watch keeps the last known set until the informer relists. A role
// whose selector matches no ready endpoint gets an empty set, logged once
// until endpoints appear.
//
// Draining: an endpoint that turns unready or terminating leaves the set on
// that event; the proxy then sends it nothing new and lets its requests in
// flight finish, and treats the draining engine's 503 as retryable on
// another engine of the pool.
//
// Each change's latency, from the informer event to SetBackends returning
// (which, for the proxy, includes the first health check of new engines),
// is in Update.Latency (Config.OnUpdate) and in the
// tandem:proxy_discovery_update_seconds histogram; with Config.Registerer
// the tandem:proxy_discovery_* metrics (backends, synced, updates_total,
// update_seconds, events_total, watch_errors_total) appear on the proxy's
// /metrics.
//
// The proxy's credentials need only list and watch on
// endpointslices.discovery.k8s.io in the namespace.
//
// Scaler (scale.go) is the planner's opt-in hand on the cluster (`tandem
// proxy --planner-scale`): it sets the prefill and decode Deployments'
// replicas to the planner's split through their scale subresource, which
// needs get and update on deployments/scale (deploy/kubernetes,
// components/planner-scale). Refused, it says so once and from then on
// only publishes.
package kubediscovery
