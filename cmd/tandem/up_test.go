package main

import (
	"strings"
	"testing"
)

// TestUpRefusesAnEmptyPool: --prefill 0 or --decode 0 is refused before
// anything starts, naming the flags, rather than read as launch.Config's
// default of one engine.
func TestUpRefusesAnEmptyPool(t *testing.T) {
	for _, args := range [][]string{
		{"--prefill", "0"},
		{"--decode", "0", "--prefill", "2"},
		{"--prefill", "-1"},
	} {
		err := runUp(args)
		if err == nil || !strings.Contains(err.Error(), "at least one engine of each role") || !strings.Contains(err.Error(), "--prefill") {
			t.Errorf("tandem up %s: %v, want the refusal naming --prefill and --decode", strings.Join(args, " "), err)
		}
	}
}
