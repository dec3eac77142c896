package tensor

import "fmt"

// quantKernel is one implementation of the quantized matrix product
// (kernelSet.qmm). Every implementation gives the same results bit for bit
// (qmatmul.go defines them), so which one runs is a matter of speed only
// and never changes a model's output.
type quantKernel struct {
	name  string
	fn    func(a *qAct, w *Mat, lo, hi int, out []float32)
	avail bool
}

// quantKernels lists the quantized kernels, best first: the
// architecture's assembly ones, then the pure-Go definition.
var quantKernels = append(archQuantKernels(), quantKernel{name: "go", avail: true})

// QuantKernels names the quantized matrix kernels in use ("avx512vnni",
// "avx2" or "go"). Unlike ISA, it does not affect results.
func QuantKernels() string { return active.Load().qmmName }

// withQuant returns a copy of ks that runs the quantized kernel named
// name, or an error naming the choices if this CPU cannot run it.
func withQuant(ks *kernelSet, name string) (*kernelSet, error) {
	for _, q := range quantKernels {
		if q.name != name {
			continue
		}
		if !q.avail {
			return nil, fmt.Errorf("tensor: quantized kernels %q are not supported by this CPU (supported: %v)", name, availQuantNames())
		}
		c := *ks
		c.qmm, c.qmmName = q.fn, q.name
		return &c, nil
	}
	return nil, fmt.Errorf("tensor: unknown quantized kernels %q (supported: %v)", name, availQuantNames())
}

// availQuantNames lists the quantized kernels this CPU can run, best first.
func availQuantNames() []string {
	var names []string
	for _, q := range quantKernels {
		if q.avail {
			names = append(names, q.name)
		}
	}
	return names
}
