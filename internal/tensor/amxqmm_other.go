//go:build !amd64

package tensor

import "errors"

// amxGroup is the activation rows one AMX kernel call takes (amd64 only).
const amxGroup = 16

// isDot32 reports false: the AMX kernel is amd64's.
func isDot32([]qdot) bool { return false }

// amxPrepare reports no rows for the AMX kernel.
func amxPrepare(*qScratch, *qAct) int { return 0 }

// amxDots is never called here (amxPrepare reports no rows).
func amxDots(*qScratch, *qAct, int, int, int, *byte, []float32) {
	panic("tensor: no AMX kernels on this architecture")
}

// amxSelfCheck reports that AMX is amd64's.
func amxSelfCheck() error { return errors.New("tensor: AMX is an amd64 extension") }

// AMXSelfCheck reports that AMX is amd64's.
func AMXSelfCheck() error { return amxSelfCheck() }

// amxBF16SelfCheck reports that AMX is amd64's.
func amxBF16SelfCheck() error { return errors.New("tensor: AMX is an amd64 extension") }

// amxBF16Fits reports false: the AMX kernels are amd64's.
func amxBF16Fits(*Mat) bool { return false }

// matmulAMXBF16 is never called here (no kernel set has amxBF16).
func (p *Pool) matmulAMXBF16([]float32, []uint16, int, *Mat, int) {
	panic("tensor: no AMX kernels on this architecture")
}
