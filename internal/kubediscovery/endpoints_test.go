package kubediscovery

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ep is an endpoint with the given conditions (nil: unset).
func ep(ready, terminating *bool, addrs ...string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: addrs, Conditions: discoveryv1.EndpointConditions{Ready: ready, Terminating: terminating}}
}

func port(name string, n int32) discoveryv1.EndpointPort {
	p := discoveryv1.EndpointPort{Port: new(n), Protocol: new(corev1.ProtocolTCP)}
	if name != "" {
		p.Name = new(name)
	}
	return p
}

func TestEndpointURLs(t *testing.T) {
	yes, no := new(true), new(false)
	v4 := discoveryv1.AddressTypeIPv4
	tests := []struct {
		name     string
		typ      discoveryv1.AddressType
		ports    []discoveryv1.EndpointPort
		eps      []discoveryv1.Endpoint
		portName string
		want     []string
	}{
		{
			name:  "ready true or unset, not terminating; sorted, deduplicated",
			typ:   v4,
			ports: []discoveryv1.EndpointPort{port("metrics", 9000), port("http", 8000)},
			eps: []discoveryv1.Endpoint{
				ep(yes, nil, "198.18.0.3"), ep(nil, nil, "198.18.0.1"), ep(no, nil, "198.18.0.2"),
				ep(yes, yes, "198.18.0.4"), ep(nil, no, "198.18.0.5"), ep(yes, nil, "198.18.0.3"),
			},
			portName: "http",
			want:     []string{"http://198.18.0.1:8000", "http://198.18.0.3:8000", "http://198.18.0.5:8000"},
		},
		{
			name:     "every address of an endpoint",
			typ:      v4,
			ports:    []discoveryv1.EndpointPort{port("http", 8000)},
			eps:      []discoveryv1.Endpoint{ep(nil, nil, "198.18.0.1", "198.18.0.9")},
			portName: "http",
			want:     []string{"http://198.18.0.1:8000", "http://198.18.0.9:8000"},
		},
		{
			name:     "IPv6 addresses are bracketed",
			typ:      discoveryv1.AddressTypeIPv6,
			ports:    []discoveryv1.EndpointPort{port("http", 8000)},
			eps:      []discoveryv1.Endpoint{ep(nil, nil, "2001:db8::1")},
			portName: "http",
			want:     []string{"http://[2001:db8::1]:8000"},
		},
		{
			name:     "FQDN addresses as they are",
			typ:      discoveryv1.AddressTypeFQDN,
			ports:    []discoveryv1.EndpointPort{port("http", 8000)},
			eps:      []discoveryv1.Endpoint{ep(nil, nil, "decode-0.tandem.svc")},
			portName: "http",
			want:     []string{"http://decode-0.tandem.svc:8000"},
		},
		{
			name:     "a non-IP in an IP slice is skipped",
			typ:      v4,
			ports:    []discoveryv1.EndpointPort{port("http", 8000)},
			eps:      []discoveryv1.Endpoint{ep(nil, nil, "example.com"), ep(nil, nil, "198.18.0.1")},
			portName: "http",
			want:     []string{"http://198.18.0.1:8000"},
		},
		{
			name:     "no port of that name: nothing",
			typ:      v4,
			ports:    []discoveryv1.EndpointPort{port("grpc", 9000)},
			eps:      []discoveryv1.Endpoint{ep(nil, nil, "198.18.0.1")},
			portName: "http",
		},
		{
			name:     "the unnamed port",
			typ:      v4,
			ports:    []discoveryv1.EndpointPort{port("", 8100)},
			eps:      []discoveryv1.Endpoint{ep(nil, nil, "198.18.0.1")},
			portName: "",
			want:     []string{"http://198.18.0.1:8100"},
		},
		{
			name:     "a UDP port of the name is not it",
			typ:      v4,
			ports:    []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(8000)), Protocol: new(corev1.ProtocolUDP)}},
			eps:      []discoveryv1.Endpoint{ep(nil, nil, "198.18.0.1")},
			portName: "http",
		},
		{
			name:     "a port without a number (all ports) cannot be dialled",
			typ:      v4,
			ports:    []discoveryv1.EndpointPort{{Name: new("http")}},
			eps:      []discoveryv1.Endpoint{ep(nil, nil, "198.18.0.1")},
			portName: "http",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "s"}, AddressType: tt.typ, Ports: tt.ports, Endpoints: tt.eps}
			if diff := cmp.Diff(tt.want, EndpointURLs(s, tt.portName, "http")); diff != "" {
				t.Errorf("EndpointURLs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNewRejects(t *testing.T) {
	ok := Pool{Role: RoleDecode, Selector: ServiceSelector("d")}
	for _, tt := range []struct {
		name  string
		pools []Pool
	}{
		{"no pool", nil},
		{"an unknown role", []Pool{{Role: "router", Selector: "a=b"}}},
		{"a role twice", []Pool{ok, ok}},
		{"no selector", []Pool{{Role: RoleDecode}}},
		{"a bad selector", []Pool{{Role: RoleDecode, Selector: "a in (b"}}},
		{"a bad scheme", []Pool{{Role: RoleDecode, Selector: "a=b", Scheme: "grpc"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(Config{Client: fakeClient(), Backends: &recorder{}, Pools: tt.pools}); err == nil {
				t.Error("New accepted it")
			}
		})
	}
	if _, err := New(Config{Client: fakeClient(), Backends: &recorder{}, Pools: []Pool{ok}}); err != nil {
		t.Errorf("a good config: %v", err)
	}
}

func TestNamespace(t *testing.T) {
	if got := namespaceFrom("/nonexistent"); got != "default" {
		t.Errorf("outside a cluster: %q, want default", got)
	}
}
