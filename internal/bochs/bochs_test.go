package bochs

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/testutil"
)

// The two functions the tests run, assembled by GNU as from (Intel syntax):
//
//	add: // func(dst, a, b *uint64, n int): dst[i] = a[i] + b[i]
//	  mov rdi, [rsp+8]; mov rsi, [rsp+16]; mov rdx, [rsp+24]; mov rcx, [rsp+32]
//	1: mov rax, [rsi]; add rax, [rdx]; mov [rdi], rax
//	  add rsi, 8; add rdx, 8; add rdi, 8; dec rcx; jnz 1b; ret
//	amx: // func(cfg *byte, a, b *int8, c *int32): c = a·b (TDPBSSD), stride 64
//	  mov rax, [rsp+8]; ldtilecfg [rax]
//	  mov rsi, [rsp+16]; mov rdi, [rsp+24]; mov r8, [rsp+32]; mov rdx, 64
//	  tilezero tmm0; tileloadd tmm1, [rsi+rdx*1]; tileloadd tmm2, [rdi+rdx*1]
//	  tdpbssd tmm0, tmm1, tmm2; tilestored [r8+rdx*1], tmm0; tilerelease; ret
//	amxSU: amx with tdpbsud (A's bytes signed, B's unsigned) for tdpbssd
const (
	addCode   = "488b7c2408488b742410488b542418488b4c2420488b064803024889074883c6084883c2084883c70848ffc975e6c3"
	amxCode   = "488b442408c4e2784900488b742410488b7c24184c8b44242048c7c240000000c4e27b49c0c4e27b4b0c16c4e27b4b1417c4e26b5ec1c4c27a4b0410c4e27849c0c3"
	amxSUCode = "488b442408c4e2784900488b742410488b7c24184c8b44242048c7c240000000c4e27b49c0c4e27b4b0c16c4e27b4b1417c4e26a5ec1c4c27a4b0410c4e27849c0c3"
)

func dir(t *testing.T) string {
	t.Helper()
	d, err := Dir()
	if err != nil {
		testutil.Missing(t, err.Error())
	}
	return d
}

func code(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRunCallsWithABI0Arguments runs a function twice, the second call on
// the first's output, and reads both results back.
func TestRunCallsWithABI0Arguments(t *testing.T) {
	const n = 300
	p := NewProgram()
	fn := p.Put(code(t, addCode), 16)
	a, b := make([]byte, 8*n), make([]byte, 8*n)
	for i := range n {
		binary.LittleEndian.PutUint64(a[8*i:], uint64(i)*1_000_003)
		binary.LittleEndian.PutUint64(b[8*i:], uint64(n-i)<<40)
	}
	pa, pb := p.Put(a, 8), p.Put(b, 8)
	d1, d2 := p.Alloc(8*n, 64), p.Alloc(8*n, 64)
	p.Call(fn, d1, pa, pb, n)
	p.Call(fn, d2, d1, pb, n)
	p.Dump(d1, 8*n)
	p.Dump(d2, 8*n)
	out := RunTest(t, p)
	for i := range n {
		want1 := uint64(i)*1_000_003 + uint64(n-i)<<40
		if got := binary.LittleEndian.Uint64(out[0][8*i:]); got != want1 {
			t.Fatalf("first call, word %d: %#x, want %#x", i, got, want1)
		}
		if got, want := binary.LittleEndian.Uint64(out[1][8*i:]), want1+uint64(n-i)<<40; got != want {
			t.Fatalf("second call, word %d: %#x, want %#x", i, got, want)
		}
	}
}

// TestAMXIsThere checks the emulated CPU's AMX against the documented
// definitions of TDPBSSD and TDPBSUD: C[m][n] = Σ_k A[m][k]·B[k/4][4n +
// k%4], B holding 4 consecutive k of each column n side by side, A's bytes
// signed, B's signed (TDPBSSD) or unsigned (TDPBSUD). Bochs 3.0 took them
// all as unsigned: scripts/bochs-binary.sh fixes that.
func TestAMXIsThere(t *testing.T) {
	for _, c := range []struct {
		name, code string
		signedB    bool
	}{{"tdpbssd", amxCode, true}, {"tdpbsud", amxSUCode, false}} {
		t.Run(c.name, func(t *testing.T) { testAMXProduct(t, c.code, c.signedB) })
	}
}

func testAMXProduct(t *testing.T, fnCode string, signedB bool) {
	rng := rand.New(rand.NewPCG(1, 2))
	a, b := make([]byte, 16*64), make([]byte, 16*64)
	for i := range a {
		a[i], b[i] = byte(rng.Uint32()), byte(rng.Uint32())
	}
	cfg := make([]byte, 64)
	cfg[0] = 1 // palette 1
	for _, tile := range []int{0, 1, 2} {
		binary.LittleEndian.PutUint16(cfg[16+2*tile:], 64) // bytes a row
		cfg[48+tile] = 16                                  // rows
	}
	p := NewProgram()
	fn := p.Put(code(t, fnCode), 16)
	pc, pa, pb := p.Put(cfg, 64), p.Put(a, 64), p.Put(b, 64)
	c := p.Alloc(16*64, 64)
	p.Call(fn, pc, pa, pb, c)
	p.Dump(c, 16*64)
	out := RunTest(t, p)[0]
	for m := range 16 {
		for n := range 16 {
			var want int32
			for k := range 64 {
				bk := int32(b[64*(k/4)+4*n+k%4])
				if signedB {
					bk = int32(int8(bk))
				}
				want += int32(int8(a[64*m+k])) * bk
			}
			if got := int32(binary.LittleEndian.Uint32(out[4*(16*m+n):])); got != want {
				t.Fatalf("C[%d][%d] = %d, want %d", m, n, got, want)
			}
		}
	}
}

// TestExceptionsAreReported runs an instruction that faults (UD2) and
// expects Run to say so rather than hang or return.
func TestExceptionsAreReported(t *testing.T) {
	p := NewProgram()
	fn := p.Put([]byte{0x0f, 0x0b}, 16)
	p.Call(fn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := Run(ctx, dir(t), p)
	if err == nil || !strings.Contains(err.Error(), "exception in the program: vector, frame words 0000000000000006 ") {
		t.Fatalf("UD2: err = %v, want the invalid-opcode exception (vector 6)", err)
	}
}

// TestBootImageIsBootS rebuilds boot.bin from boot.S where GNU as is
// installed and compares.
func TestBootImageIsBootS(t *testing.T) {
	as, err := exec.LookPath("as")
	if err != nil {
		t.Skip("no GNU as here")
	}
	ld, err := exec.LookPath("ld")
	if err != nil {
		t.Skip("no GNU ld here")
	}
	tmp := t.TempDir()
	obj, bin := filepath.Join(tmp, "boot.o"), filepath.Join(tmp, "boot.bin")
	for _, args := range [][]string{
		{as, "--64", "-o", obj, "boot.S"},
		{ld, "-m", "elf_x86_64", "-Ttext", "0x7c00", "--oformat", "binary", "-o", bin, obj},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	got, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(bootImage) {
		t.Fatal("boot.bin differs from boot.S assembled: run internal/bochs/gen.sh")
	}
}
