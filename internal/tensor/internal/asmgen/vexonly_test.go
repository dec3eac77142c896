package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckVEXOnly checks that an AVX2 quantized kernel touching AVX-512
// registers or instructions is refused, and that AVX-512 kernels and the
// AVX2 float kernels are left alone.
func TestCheckVEXOnly(t *testing.T) {
	ok := strings.Join([]string{
		"TEXT ·qpackQ8_0AVX2(SB), NOSPLIT, $0-32",
		"\tVPMADDUBSW Y1, Y2, Y3",
		"TEXT ·qpackQ8_0AVX512(SB), NOSPLIT, $0-32",
		"\tVPDPBUSD.BCST (AX), Z1, Z2",
		"TEXT ·gemmAVX2F32R1(SB), NOSPLIT, $0-72",
		"\tVMOVUPS Y17, Y2",
	}, "\n")
	for _, bad := range []string{"\tVMOVUPS Y17, Y2", "\tVPXORD Y1, Y2, Y3", "\tVPDPBUSD Y1, Y2, Y3", "\tVPMOVDW Z1, Y2", "\tKXNORW K1, K1, K1"} {
		dir := t.TempDir()
		path := filepath.Join(dir, "k.s")
		if err := os.WriteFile(path, []byte(ok), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := checkVEXOnly(path); err != nil {
			t.Fatalf("clean file refused: %v", err)
		}
		src := ok + "\nTEXT ·qdotKAVX2R1(SB), NOSPLIT, $0-56\n" + bad + "\n"
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := checkVEXOnly(path); err == nil {
			t.Errorf("%q in an AVX2 kernel was accepted", strings.TrimSpace(bad))
		}
	}
}
