package main

// The check, run on the generated assembly, that no AVX2 quantized or peak
// kernel uses anything only AVX-512 has.

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

// evexOnly matches what an AVX2 CPU cannot run: registers 16-31, ZMM and
// mask registers, and EVEX-only instructions.
var evexOnly = regexp.MustCompile(`\b([XY](1[6-9]|2[0-9]|3[01])|Z[0-9]+|K[0-7])\b|\.BCST|VPTERNLOG|VPMOV[DQ][BW]|VMOVDQ[AU](32|64)|VP(AND|OR|XOR)[DQ]\b|VSHUF[IF](32|64)|VPDPB|VPDPW|KXNOR`)

// checkVEXOnly fails if a quantized or peak AVX2 kernel in the assembly at path
// uses something only AVX-512 has (the register allocator may pick
// registers 16-31 if a kernel needs more than 16).
func checkVEXOnly(path string) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	fn := ""
	for n, line := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(line, "TEXT ") {
			fn = line
		}
		if strings.Contains(fn, "AVX2") && (strings.HasPrefix(fn, "TEXT ·q") || strings.HasPrefix(fn, "TEXT ·peak")) && evexOnly.MatchString(line) {
			return fmt.Errorf("%s:%d: AVX2 kernel needs AVX-512: %s", path, n+1, strings.TrimSpace(line))
		}
	}
	return nil
}
