// Package bochs runs x86-64 machine code in the Bochs emulator, for tests of
// kernels the host CPU cannot run: AMX, on a CPU without it. Bochs models
// each instruction from Intel's definition (a reference Tandem did not
// write); its sapphire_rapids CPU has AMX-TILE, AMX-INT8, AMX-BF16 and
// AVX-512.
//
// A Program is a memory image: the caller places bytes (a kernel's machine
// code, its inputs, room for its outputs) at addresses it gets back, queues
// calls of functions in it with Go ABI0 argument words, and names the
// ranges to read back. Run boots Bochs from a disk image whose first 8 KiB
// are boot.bin (boot.S: long mode with the first GiB mapped one to one, SSE,
// AVX, AVX-512 and the AMX tile state enabled, exceptions reported) and the
// program after them, and returns the ranges' bytes after the calls. A
// function run so must not touch the Go runtime (NOSPLIT assembly) and must
// reach its data through its arguments only (no RIP-relative globals: the
// code is copied to another address).
//
// The emulator is $TANDEM_BOCHS: a directory holding the bochs binary, built
// with AMX (scripts/bochs-binary.sh builds Debian's Bochs 3.0 source so), and
// bios.bin (SeaBIOS, from the same source).
package bochs

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/tandem-serve/tandem/internal/testutil"
)

//go:embed boot.bin
var bootImage []byte

// Base is the address of a Program's first byte: disk offset 8 KiB, loaded
// after the boot code at 0x7c00.
const Base = 0x7c00 + 8192

// limit is the end of the memory the boot code loads the disk into (the
// real-mode BIOS reads below the extended BIOS data area).
const limit = 0x80000

// magic opens a Program's header ("TANDEMBX").
const magic = 0x58424d45444e4154

// headerBytes is the header's size: magic, ncalls, calls, ndumps, dumps.
const headerBytes = 40

// Program is a memory image to run: the header first, then what the caller
// placed.
type Program struct {
	mem   []byte
	calls []call
	dumps [][2]uint64
}

type call struct {
	fn   uint64
	args []uint64
}

// NewProgram returns an empty Program.
func NewProgram() *Program { return &Program{mem: make([]byte, headerBytes)} }

// Alloc reserves n zero bytes aligned to align (a power of two) and returns
// their address.
func (p *Program) Alloc(n, align int) uint64 {
	off := (len(p.mem) + align - 1) &^ (align - 1)
	p.mem = append(p.mem, make([]byte, off+n-len(p.mem))...)
	return Base + uint64(off)
}

// Put copies b into the image aligned to align and returns its address.
func (p *Program) Put(b []byte, align int) uint64 {
	a := p.Alloc(len(b), align)
	copy(p.mem[a-Base:], b)
	return a
}

// Call queues a call of the function at fn with args as its ABI0 argument
// words (one per pointer or int argument, in order). Calls run in order.
func (p *Program) Call(fn uint64, args ...uint64) {
	p.calls = append(p.calls, call{fn: fn, args: append([]uint64(nil), args...)})
}

// Dump names n bytes at addr to read back after the calls; Run returns the
// dumps in the order they were named.
func (p *Program) Dump(addr uint64, n int) {
	p.dumps = append(p.dumps, [2]uint64{addr, uint64(n)})
}

// image lays out the call and dump tables and the argument frames after the
// caller's bytes and fills the header.
func (p *Program) image() ([]byte, error) {
	mem := append([]byte(nil), p.mem...)
	put := func(words []uint64) uint64 {
		for len(mem)%8 != 0 {
			mem = append(mem, 0)
		}
		a := Base + uint64(len(mem))
		for _, w := range words {
			mem = binary.LittleEndian.AppendUint64(mem, w)
		}
		return a
	}
	var callTable []uint64
	for _, c := range p.calls {
		args := put(c.args)
		callTable = append(callTable, c.fn, args, uint64(8*len(c.args)))
	}
	calls := put(callTable)
	var dumpTable []uint64
	for _, d := range p.dumps {
		dumpTable = append(dumpTable, d[0], d[1])
	}
	dumps := put(dumpTable)
	for i, w := range []uint64{magic, uint64(len(p.calls)), calls, uint64(len(p.dumps)), dumps} {
		binary.LittleEndian.PutUint64(mem[8*i:], w)
	}
	if Base+uint64(len(mem)) > limit {
		return nil, fmt.Errorf("bochs: the program's %d bytes pass the %#x the boot code loads", len(mem), limit)
	}
	return mem, nil
}

// FuncCode returns a copy of the machine code of the function whose first
// instruction is at entry (an assembly function's address, as LEAQ of its
// symbol gives it): the bytes up to where the runtime's function table
// says the next function starts.
func FuncCode(entry *byte) ([]byte, error) {
	pc := uintptr(unsafe.Pointer(entry))
	f := runtime.FuncForPC(pc)
	if f == nil || f.Entry() != pc {
		return nil, fmt.Errorf("bochs: %#x is not a function's entry", pc)
	}
	n := 1
	for n < 1<<20 && runtime.FuncForPC(pc+uintptr(n)) == f {
		n++
	}
	return bytes.Clone(unsafe.Slice(entry, n)), nil
}

// Dir returns the directory holding the bochs binary and bios.bin
// ($TANDEM_BOCHS), or an error saying how to get one.
func Dir() (string, error) {
	d := os.Getenv("TANDEM_BOCHS")
	if d == "" {
		return "", errors.New("bochs: TANDEM_BOCHS is unset: build Bochs with AMX by `bash scripts/bochs-binary.sh` and set TANDEM_BOCHS to the directory it prints")
	}
	for _, f := range []string{"bochs", "bios.bin"} {
		if _, err := os.Stat(filepath.Join(d, f)); err != nil {
			return "", fmt.Errorf("bochs: TANDEM_BOCHS=%s lacks %s: %w", d, f, err)
		}
	}
	return d, nil
}

// Run boots the emulator in dir with the program, runs its calls and
// returns its dumps. An exception in the program, a program Bochs could not
// boot or an emulator that does not finish before ctx ends is an error that
// quotes the emulator's log.
func Run(ctx context.Context, dir string, p *Program) ([][]byte, error) {
	prog, err := p.image()
	if err != nil {
		return nil, err
	}
	// The disk: boot code, the program, padded to whole sectors and to the
	// geometry bochsrc names (20 cylinders × 16 heads × 63 sectors).
	const cyl, heads, spt = 20, 16, 63
	disk := make([]byte, cyl*heads*spt*512)
	n := copy(disk, bootImage)
	n += copy(disk[n:], prog)
	sectors := (n + 511) / 512
	binary.LittleEndian.PutUint16(disk[508:], uint16(sectors))

	work, err := os.MkdirTemp("", "tandem-bochs-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	diskPath := filepath.Join(work, "disk.img")
	if err := os.WriteFile(diskPath, disk, 0o644); err != nil {
		return nil, err
	}
	// The BIOS calls a VGA ROM's initialization; the program writes to port
	// 0xe9, not a screen, so the ROM is an empty one (a far return).
	vgaPath := filepath.Join(work, "vga.bin")
	if err := os.WriteFile(vgaPath, emptyOptionROM(), 0o644); err != nil {
		return nil, err
	}
	logPath := filepath.Join(work, "bochs.log")
	rc := fmt.Sprintf(`megs: 64
cpu: model=sapphire_rapids, count=1, ips=100000000, reset_on_triple_fault=0
romimage: file=%q
vgaromimage: file=%q
ata0-master: type=disk, path=%q, mode=flat, cylinders=%d, heads=%d, spt=%d
boot: disk
port_e9_hack: enabled=1
display_library: nogui
clock: sync=none
log: %q
panic: action=fatal
error: action=report
info: action=ignore
debug: action=ignore
`, filepath.Join(dir, "bios.bin"), vgaPath, diskPath, cyl, heads, spt, logPath)
	rcPath := filepath.Join(work, "bochsrc")
	if err := os.WriteFile(rcPath, []byte(rc), 0o644); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "bochs"), "-q", "-f", rcPath)
	cmd.Dir = work
	cmd.Stdout = &out
	cmd.Stderr = &out
	runErr := cmd.Run()
	dumps, err := parse(out.String())
	if err != nil {
		logText, _ := os.ReadFile(logPath)
		return nil, fmt.Errorf("%w (bochs: %v; its output: %q; its log's end: %q)", err, runErr, tail(out.String(), 2000), tail(string(logText), 2000))
	}
	if len(dumps) != len(p.dumps) {
		return nil, fmt.Errorf("bochs: %d dumps back, %d named", len(dumps), len(p.dumps))
	}
	for i, d := range dumps {
		if uint64(len(d)) != p.dumps[i][1] {
			return nil, fmt.Errorf("bochs: dump %d has %d bytes, %d named", i, len(d), p.dumps[i][1])
		}
	}
	return dumps, nil
}

// RunTest runs p as Run does, in the emulator $TANDEM_BOCHS names, within
// a few minutes, and returns its dumps; without an emulator it skips the
// test, or fails it under TANDEM_REQUIRE_TESTDATA=1 (testutil.Missing), and
// any other error fails it.
func RunTest(t testing.TB, p *Program) [][]byte {
	t.Helper()
	dir, err := Dir()
	if err != nil {
		testutil.Missing(t, err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := Run(ctx, dir, p)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// emptyOptionROM returns a 512-byte option ROM whose initialization
// returns at once: the 0x55 0xaa signature, its size in 512-byte blocks, a
// far return at the entry (offset 3), and a last byte that makes the bytes
// sum to zero.
func emptyOptionROM() []byte {
	rom := make([]byte, 512)
	rom[0], rom[1], rom[2], rom[3] = 0x55, 0xaa, 1, 0xcb
	var sum byte
	for _, b := range rom {
		sum += b
	}
	rom[511] = -sum
	return rom
}

// parse reads the boot code's port 0xe9 output out of Bochs's: lines "D" +
// hex (a dump), then "E"; or "X" + vector, two frame words (an exception);
// or "M" (no program) and "F" (the disk could not be read).
func parse(s string) ([][]byte, error) {
	var dumps [][]byte
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "D"):
			b, err := hex.DecodeString(line[1:])
			if err != nil {
				return nil, fmt.Errorf("bochs: a dump line does not decode: %w", err)
			}
			dumps = append(dumps, b)
		case line == "E":
			return dumps, nil
		case strings.HasPrefix(line, "X"):
			return nil, fmt.Errorf("bochs: exception in the program: vector, frame words %s", line[1:])
		case line == "M":
			return nil, errors.New("bochs: the boot code found no program header")
		case strings.HasPrefix(line, "F"):
			return nil, errors.New("bochs: the boot code could not read the disk")
		}
	}
	return nil, errors.New("bochs: the program did not finish")
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
