package kubediscovery

import (
	"net"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// ServiceNameLabel is the label the EndpointSlice controller puts on every
// slice of a Service: its name.
const ServiceNameLabel = discoveryv1.LabelServiceName

// ServiceSelector returns the label selector matching the EndpointSlices of
// the Service named service.
func ServiceSelector(service string) string { return ServiceNameLabel + "=" + service }

// Ready reports whether an endpoint takes new requests, as the EndpointSlice
// API defines its conditions: ready true or unset (nil means true), and not
// terminating (nil means false). A terminating endpoint is excluded even
// when ready, as it is for a Service with publishNotReadyAddresses: a
// draining engine must get no new work.
func Ready(c discoveryv1.EndpointConditions) bool {
	if c.Ready != nil && !*c.Ready {
		return false
	}
	return c.Terminating == nil || !*c.Terminating
}

// EndpointURLs returns the base URLs ("scheme://host:port", IPv6 addresses
// bracketed) of the ready endpoints of slice on its port named portName,
// sorted and without duplicates. An empty portName matches the port without
// a name (a Service with a single unnamed port). A slice without that port
// (or whose port has no number, meaning all ports) yields none; so does a
// port of another protocol than TCP.
func EndpointURLs(slice *discoveryv1.EndpointSlice, portName, scheme string) []string {
	port, ok := PortOf(slice, portName)
	if !ok {
		return nil
	}
	p := strconv.Itoa(int(port))
	var out []string
	for _, ep := range slice.Endpoints {
		if !Ready(ep.Conditions) {
			continue
		}
		for _, addr := range ep.Addresses {
			if addr == "" {
				continue
			}
			if slice.AddressType != discoveryv1.AddressTypeFQDN && net.ParseIP(addr) == nil {
				continue // not an IP in an IP slice: refuse rather than guess
			}
			out = append(out, scheme+"://"+net.JoinHostPort(addr, p))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// PortOf returns the number of slice's TCP port named portName, if it has
// one.
func PortOf(slice *discoveryv1.EndpointSlice, portName string) (int32, bool) {
	for _, sp := range slice.Ports {
		name := ""
		if sp.Name != nil {
			name = *sp.Name
		}
		if name != portName || sp.Port == nil {
			continue
		}
		if sp.Protocol != nil && *sp.Protocol != corev1.ProtocolTCP {
			continue
		}
		return *sp.Port, true
	}
	return 0, false
}

// union merges per-slice URL lists into one sorted list without duplicates
// (an endpoint may appear in two slices while the controller moves it).
func union(lists map[string][]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
