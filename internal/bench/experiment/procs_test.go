package experiment

import (
	"slices"
	"testing"
)

// TestColocatedFlags: the plain colocated engine has no cadence flag; a
// cadence engine carries its interval in its flags and its name (and so
// its log file), at interval 1 too, so it is never taken for the plain
// one.
func TestColocatedFlags(t *testing.T) {
	for _, c := range []struct {
		mnbt, interval int
		name           string
		flags          []string
	}{
		{256, 0, "colocated-mnbt256", []string{"--max-num-batched-tokens", "256"}},
		{256, 1, "colocated-mnbt256-interval1", []string{"--max-num-batched-tokens", "256", "--prefill-schedule-interval", "1"}},
		{512, 4, "colocated-mnbt512-interval4", []string{"--max-num-batched-tokens", "512", "--prefill-schedule-interval", "4"}},
	} {
		name, flags := colocatedFlags(c.mnbt, c.interval)
		if name != c.name || !slices.Equal(flags, c.flags) {
			t.Errorf("colocatedFlags(%d, %d) = %q, %q; want %q, %q", c.mnbt, c.interval, name, flags, c.name, c.flags)
		}
	}
}
