package main

import (
	"fmt"
	"strconv"
	"strings"
)

// byteSize is a flag holding a size in bytes, written as a plain number or
// with a suffix: KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of
// 1024).
type byteSize int64

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

func (b *byteSize) String() string {
	if b == nil {
		return "0"
	}
	return strconv.FormatInt(int64(*b), 10)
}

// Set parses s.
func (b *byteSize) Set(s string) error {
	s = strings.TrimSpace(s)
	mult := int64(1)
	num := s
	for _, u := range byteUnits {
		if before, ok := strings.CutSuffix(s, u.suffix); ok {
			mult, num = u.mult, strings.TrimSpace(before)
			break
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 || v*float64(mult) >= 1<<63 {
		return fmt.Errorf("%q is not a size: use bytes or a suffix such as 512MiB or 2GiB", s)
	}
	*b = byteSize(v * float64(mult))
	return nil
}
