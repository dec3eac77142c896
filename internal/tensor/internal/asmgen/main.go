// Command asmgen generates the amd64 assembly kernels of package tensor with
// avo. Run it through `go generate` in internal/tensor; the output
// (kern_amd64.s and kern_amd64_stubs.go) is committed, so building Tandem does
// not need avo.
//
// Every dot product computed by a kernel of one instruction set has the same
// accumulation structure, whichever kernel computes it:
//
//   - AVX-512: one 16-lane accumulator marches over K in steps of 16; the last
//     partial step loads zeros in the masked-off lanes; the 16 lanes are then
//     reduced by the fixed tree (l+l⁸)(l+l⁴)(l+l²)(l+l¹).
//   - AVX2: one 8-lane accumulator marches over K in steps of 8, is reduced by
//     the tree (l+l⁴)(l+l²)(l+l¹), and the K%8 tail is added one element at a
//     time with scalar FMAs, in order.
//
// This is what makes the matrix product batch invariant: an output element
// does not depend on the tile shape, the edge handling or M.
package main

import (
	"flag"
	"fmt"
	"os"

	. "github.com/mmcloughlin/avo/build"
)

func main() {
	ConstraintExpr("amd64")
	constants()
	prefetchRows()
	for _, s := range []isa{avx512, avx2} {
		for _, dt := range []dtype{dtF32, dtBF16, dtF16} {
			for r := 1; r <= 4; r++ {
				if r == 1 && s.lanes == 16 {
					gemmWideR1(s, dt)
					continue
				}
				if r == 1 && s.lanes == 8 && dt != dtF16 {
					gemvAVX2(dt)
					continue
				}
				gemm(s, dt, r)
			}
		}
		if s.lanes == 8 {
			for _, dt := range []dtype{dtF32, dtBF16, dtF16} {
				for r := 3; r <= 4; r++ {
					gemmKB(dt, r)
				}
			}
		}
		dot(s)
		axpy(s)
		if s.lanes == 16 {
			axpyRows512(dtF32)
			axpyRows512(dtBF16)
		}
		siluMul(s)
		expSum(s)
		if s.lanes == 8 {
			quantKernelsAVX2()
			qact8_0AVX2()
			qact8KAVX2()
			rowKernels(false)
			for g := 1; g <= 4; g++ {
				axpyRowsAVX2(dtBF16, g)
			}
			for g := 1; g <= 4; g++ {
				axpyRowsAVX2(dtF32, g)
			}
			for g := 2; g <= 4; g++ {
				attnValuesAVX2(g)
			}
			argMaxAVX2(iotaTable())
			for _, st := range readScanStreams {
				readScanAVX2(st)
			}
			for r := 1; r <= 3; r++ {
				attnScoresAVX2(r)
			}
			for _, prefetch := range []bool{false, true} {
				for r := 1; r <= 3; r++ {
					attnKeysAVX2(r, prefetch)
				}
			}
		}
		if s.lanes == 16 {
			gemmDPR1()
			for r := 2; r <= 4; r++ {
				gemmDP(r)
			}
			cvtBF16()
			cvtBF16Stream()
			iota := iotaTable()
			argMax512(iota)
			appendAbove512(iota)
			for g := 2; g <= 4; g++ {
				axpyRowsGroup(g)
			}
			for r := 1; r <= 4; r++ {
				attnScores(r)
			}
			attnSoftmax()
			pvIdx := pvIndex()
			attnPV(pvIdx)
			quantKernels()
			amxKernels()
			rowKernels(true)
			for r := 1; r <= 4; r++ {
				attnKeysDP(r)
			}
			attnPVStream(pvIdx)
		}
	}
	peakKernels()
	Generate()
	out := flag.Lookup("out").Value.String()
	if err := rawEncode(out); err != nil {
		fmt.Fprintln(os.Stderr, "asmgen:", err)
		os.Exit(1)
	}
	if err := checkVEXOnly(out); err != nil {
		fmt.Fprintln(os.Stderr, "asmgen:", err)
		os.Exit(1)
	}
}
