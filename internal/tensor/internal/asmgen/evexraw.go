package main

// Neither Go's assembler nor avo knows VDPBF16PS or VCVTNEPS2BF16. The
// generator emits them as pseudo-instructions with their register operands
// declared, so avo's register allocator treats them like any other
// instruction, and rawEncode then replaces each of them in the output by its
// EVEX encoding (BYTE directives). This file holds the two emitters, the
// encoder and rawEncode.

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// vdpbf16ps emits acc += Σpairs a·b (Go operand order: b, a, acc).
func vdpbf16ps(b, a, acc VecVirtual) {
	Instruction(&ir.Instruction{
		Opcode:   "VDPBF16PS",
		Operands: []Op{b, a, acc},
		Inputs:   []Op{b, a, acc},
		Outputs:  []Op{acc},
	})
}

// vcvtneps2bf16 emits dst (16 bf16 in a YMM) = src (16 f32 in a ZMM)
// rounded to nearest even.
func vcvtneps2bf16(src, dst VecVirtual) {
	Instruction(&ir.Instruction{
		Opcode:   "VCVTNEPS2BF16",
		Operands: []Op{src, dst},
		Inputs:   []Op{src},
		Outputs:  []Op{dst},
	})
}

// evex returns the EVEX encoding of a 512-bit, W0, 0F38-map instruction
// with register operands only: reg is ModRM.reg (the destination), vvvv the
// second source (0 and unused when the instruction has none, encoded as
// 1111), rm ModRM.rm. pp selects the mandatory prefix (1: 66, 2: F3, 3: F2).
func evex(pp byte, opcode byte, reg, vvvv, rm int, hasV bool) []byte {
	bit := func(v, b int) byte { return byte(v>>b) & 1 }
	p0 := (1-bit(reg, 3))<<7 | (1-bit(rm, 4))<<6 | (1-bit(rm, 3))<<5 | (1-bit(reg, 4))<<4 | 0b10
	vv, vhi := byte(0b1111), byte(1)
	if hasV {
		vv, vhi = ^byte(vvvv)&0b1111, 1-bit(vvvv, 4)
	}
	p1 := vv<<3 | 1<<2 | pp
	p2 := byte(0b10)<<5 | vhi<<3
	modrm := 0b11<<6 | byte(reg&7)<<3 | byte(rm&7)
	return []byte{0x62, p0, p1, p2, opcode, modrm}
}

// encodeDPBF16PS encodes VDPBF16PS zmm(dst), zmm(src1), zmm(src2) — Go
// operand order src2, src1, dst.
func encodeDPBF16PS(src2, src1, dst int) []byte { return evex(2, 0x52, dst, src1, src2, true) }

// encodeCVTNEPS2BF16 encodes VCVTNEPS2BF16 ymm(dst), zmm(src).
func encodeCVTNEPS2BF16(src, dst int) []byte { return evex(2, 0x72, dst, 0, src, false) }

var rawLine = regexp.MustCompile(`^(\s*)(VDPBF16PS|VCVTNEPS2BF16)\s+(.*)$`)
var rawReg = regexp.MustCompile(`^[XYZ](\d+)$`)

// writeRaw writes an instruction's encoding enc as BYTE directives after
// indent, with text (its mnemonic and operands) as a comment above.
func writeRaw(out *bytes.Buffer, indent, text string, enc []byte) {
	fmt.Fprintf(out, "%s// %s\n%s", indent, strings.TrimSpace(text), indent)
	for i, b := range enc {
		if i > 0 {
			out.WriteString("; ")
		}
		fmt.Fprintf(out, "BYTE $0x%02x", b)
	}
	out.WriteString("\n")
}

// rawEncode rewrites the pseudo-instructions in the generated assembly at
// path into BYTE directives, keeping the mnemonic as a comment.
func rawEncode(path string) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	for n, line := range bytes.SplitAfter(src, []byte("\n")) {
		if a := amxLine.FindSubmatch(bytes.TrimRight(line, "\n")); a != nil {
			enc, err := encodeAMX(string(a[2]), string(a[3]))
			if err != nil {
				return fmt.Errorf("%s:%d: %w", path, n+1, err)
			}
			writeRaw(&out, string(a[1]), string(a[2])+" "+string(a[3]), enc)
			continue
		}
		m := rawLine.FindSubmatch(bytes.TrimRight(line, "\n"))
		if m == nil {
			out.Write(line)
			continue
		}
		var regs []int
		for _, op := range bytes.Split(m[3], []byte(",")) {
			r := rawReg.FindSubmatch(bytes.TrimSpace(op))
			if r == nil {
				return fmt.Errorf("%s:%d: %s: operand %q is not a vector register", path, n+1, m[2], op)
			}
			v, _ := strconv.Atoi(string(r[1]))
			regs = append(regs, v)
		}
		var enc []byte
		switch {
		case string(m[2]) == "VDPBF16PS" && len(regs) == 3:
			enc = encodeDPBF16PS(regs[0], regs[1], regs[2])
		case string(m[2]) == "VCVTNEPS2BF16" && len(regs) == 2:
			enc = encodeCVTNEPS2BF16(regs[0], regs[1])
		default:
			return fmt.Errorf("%s:%d: %s: want 3 or 2 register operands", path, n+1, m[2])
		}
		writeRaw(&out, string(m[1]), string(m[2])+" "+string(m[3]), enc)
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}
