//go:build !amd64

package tensor

import "errors"

// amxGroup is the activation rows one AMX kernel call takes (amd64 only).
const amxGroup = 16

// amxDot is amd64's AMX dot kernel (none here).
type amxDot struct{}

// amxFor reports no AMX kernel: they are amd64's.
func amxFor([]qdot, *qAct) (*amxDot, int) { return nil, 0 }

// prepareAMX leaves no rows for an AMX kernel (no kernel set has amx
// here).
func (a *qAct) prepareAMX() { a.amxRows = 0 }

// amxRun is never called here (amxFor reports no kernel).
func amxRun(*qScratch, *qAct, *amxDot, int, int, int, *byte, []float32) {
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

// AMXBF16SelfCheck reports that AMX is amd64's.
func AMXBF16SelfCheck() error { return amxBF16SelfCheck() }
