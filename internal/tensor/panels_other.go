//go:build !amd64

package tensor

// panelKernels reports false: only the amd64 AVX-512 kernels read panels.
func panelKernels() bool { return false }

// packPanels is never called here (PanelBytes is 0).
func packPanels(*Mat, []byte) { panic("tensor: no panel kernels on this architecture") }

// qmmPanels and qmmPanelsAMX are never called here (no Mat is
// panel-stored).
func qmmPanels(*qAct, *Mat, int, int, []float32) {
	panic("tensor: no panel kernels on this architecture")
}

func qmmPanelsAMX(*qAct, *Mat, int, int, []float32) {
	panic("tensor: no panel kernels on this architecture")
}
