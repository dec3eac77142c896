package server

import (
	"strings"
	"testing"
)

func TestPagesAdviceSpeaksOnlyWhenFewWeightsAreInHugePages(t *testing.T) {
	const total = 100 << 20
	for _, tc := range []struct {
		name        string
		huge        int64
		mode, needs string
	}{
		{"most in huge pages", 80 << 20, "madvise", ""},
		{"half in huge pages", 50 << 20, "never", ""},
		{"none, THP off", 0, "never", "set it to madvise"},
		{"few, THP on", 10 << 20, "madvise", "defrag"},
		{"few, THP always", 0, "always", "defrag"},
		{"few, THP unknown (not Linux)", 0, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := pagesAdvice(total, tc.huge, tc.mode)
			if (tc.needs == "") != (got == "") || !strings.Contains(got, tc.needs) {
				t.Errorf("pagesAdvice(%d of %d, %q) = %q, want one containing %q", tc.huge, total, tc.mode, got, tc.needs)
			}
		})
	}
}
