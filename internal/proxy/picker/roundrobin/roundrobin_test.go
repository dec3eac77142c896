package roundrobin

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tandem-serve/tandem/internal/proxy/picker"
)

func TestPick(t *testing.T) {
	eps := func(idx ...int) []picker.Endpoint {
		var out []picker.Endpoint
		for _, i := range idx {
			out = append(out, picker.Endpoint{Index: i})
		}
		return out
	}
	tests := []struct {
		name      string
		endpoints []picker.Endpoint
		calls     int
		want      []int // chosen Endpoint.Index per call
	}{
		{"three backends are taken in turn", eps(0, 1, 2), 7, []int{0, 1, 2, 0, 1, 2, 0}},
		{"a single backend is always taken", eps(4), 3, []int{4, 4, 4}},
		{"rotation goes on over the healthy ones only", eps(0, 2), 4, []int{0, 2, 0, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := New()
			var got []int
			for range tt.calls {
				got = append(got, tt.endpoints[p.Pick(&picker.Request{}, tt.endpoints)].Index)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("picks (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPickWithNoEndpointsDoesNotPanic(t *testing.T) {
	if got := New().Pick(&picker.Request{}, nil); got != 0 {
		t.Errorf("Pick(nil) = %d, want 0", got)
	}
}
