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

// QuantKernels names the quantized matrix kernels in use for products with
// several activation rows ("avx512vnni", "avx2" or "go"). Unlike ISA, it
// does not affect results.
func QuantKernels() string { return active.Load().qmmName }

// DecodeQuantKernels names the quantized matrix kernels in use for products
// with one activation row (a lone sequence's decode token): QuantKernels'
// unless the calibration found others faster there.
func DecodeQuantKernels() string {
	ks := active.Load()
	if ks.qmmRow == nil {
		return ks.qmmName
	}
	return ks.qmmRowName
}

// withQuant returns a copy of ks that runs the quantized kernel named
// name for every product, or an error naming the choices if this CPU
// cannot run it.
func withQuant(ks *kernelSet, name string) (*kernelSet, error) {
	return withQuants(ks, name, name)
}

// withQuants returns a copy of ks that runs the quantized kernels named
// name for products with several activation rows and those named row for
// one row, or an error naming the choices if this CPU cannot run one.
func withQuants(ks *kernelSet, name, row string) (*kernelSet, error) {
	q, err := findQuant(name)
	if err != nil {
		return nil, err
	}
	qr, err := findQuant(row)
	if err != nil {
		return nil, err
	}
	c := *ks
	c.qmm, c.qmmName = q.fn, q.name
	c.qmmRow, c.qmmRowName = nil, ""
	if qr.name != q.name {
		c.qmmRow, c.qmmRowName = qr.fn, qr.name
		if c.qmmRow == nil {
			c.qmmRow = qmmGo
		}
	}
	return &c, nil
}

// findQuant returns the quantized kernels named name if this CPU can run
// them.
func findQuant(name string) (quantKernel, error) {
	for _, q := range quantKernels {
		if q.name != name {
			continue
		}
		if !q.avail {
			return q, fmt.Errorf("tensor: quantized kernels %q are not supported by this CPU (supported: %v)", name, availQuantNames())
		}
		return q, nil
	}
	return quantKernel{}, fmt.Errorf("tensor: unknown quantized kernels %q (supported: %v)", name, availQuantNames())
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
