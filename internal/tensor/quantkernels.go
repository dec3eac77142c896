package tensor

import (
	"fmt"
	"strings"
)

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
// unless the calibration found others faster there. Where formats differ it
// says so in TANDEM_KERNELS' decode form: the kernels of most formats, then
// format=kernels for the others ("avx2,q6_k=avx512vnni").
func DecodeQuantKernels() string {
	ks := active.Load()
	var names [numDTypes]string
	for d := range numDTypes {
		if d.Quantized() {
			names[d] = ks.qmmName
			if ks.qmmRow[d] != nil {
				names[d] = ks.qmmRowName[d]
			}
		}
	}
	return formatRowQuants(names)
}

// formatRowQuants writes per-format kernel names (set for the quantized
// dtypes) as DecodeQuantKernels does: the name most formats have (Q8_0's
// on a tie) alone, then format=name for each format that differs, in
// dtype order.
func formatRowQuants(names [numDTypes]string) string {
	count := map[string]int{}
	common := names[Q8_0]
	for d, n := range names {
		if DType(d).Quantized() {
			if count[n]++; count[n] > count[common] {
				common = n
			}
		}
	}
	out := common
	for d, n := range names {
		if DType(d).Quantized() && n != common {
			out += "," + DType(d).String() + "=" + n
		}
	}
	return out
}

// parseRowQuants reads a decode choice in formatRowQuants' form (entries
// separated by commas: a bare name for the formats not named, or
// format=name) into per-format names, def where nothing names a format.
func parseRowQuants(spec, def string) ([numDTypes]string, error) {
	var names [numDTypes]string
	for d := range numDTypes {
		if d.Quantized() {
			names[d] = def
		}
	}
	named := map[DType]bool{}
	for e := range strings.SplitSeq(spec, ",") {
		f, name, perFormat := strings.Cut(e, "=")
		if !perFormat {
			for d := range numDTypes {
				if d.Quantized() && !named[d] {
					names[d] = e
				}
			}
			continue
		}
		d, err := ParseDType(f)
		if err != nil || !d.Quantized() {
			return names, fmt.Errorf("tensor: %q in %q names no quantized format (%s)", f, spec, quantFormatNames())
		}
		names[d], named[d] = name, true
	}
	return names, nil
}

// quantFormatNames lists the quantized formats' names.
func quantFormatNames() string {
	var fs []string
	for d := range numDTypes {
		if d.Quantized() {
			fs = append(fs, d.String())
		}
	}
	return strings.Join(fs, ", ")
}

// withQuant returns a copy of ks that runs the quantized kernel named
// name for every product, or an error naming the choices if this CPU
// cannot run it.
func withQuant(ks *kernelSet, name string) (*kernelSet, error) {
	return withQuants(ks, name, name)
}

// withQuants returns a copy of ks that runs the quantized kernels named
// name for products with several activation rows and those rows names
// (parseRowQuants' form) for one row, or an error naming the choices if
// this CPU cannot run one.
func withQuants(ks *kernelSet, name, rows string) (*kernelSet, error) {
	q, err := findQuant(name)
	if err != nil {
		return nil, err
	}
	names, err := parseRowQuants(rows, name)
	if err != nil {
		return nil, err
	}
	if q.name == "amx" {
		// Chosen only where it gives the other kernels' bits.
		if err := amxSelfCheck(); err != nil {
			return nil, err
		}
	}
	c := *ks
	c.qmm, c.qmmName, c.amx = q.fn, q.name, q.name == "amx"
	c.qmmRow, c.qmmRowName = [numDTypes]func(a *qAct, w *Mat, lo, hi int, out []float32){}, [numDTypes]string{}
	for d, row := range names {
		if !DType(d).Quantized() || row == q.name {
			continue
		}
		qr, err := findQuant(row)
		if err != nil {
			return nil, err
		}
		c.qmmRow[d], c.qmmRowName[d] = qr.fn, qr.name
		if c.qmmRow[d] == nil {
			c.qmmRow[d] = qmmGo
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
