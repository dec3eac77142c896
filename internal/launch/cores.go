package launch

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// AllowedCPUs returns the CPUs this process may run on (its affinity mask,
// which honors taskset and container cpusets), in increasing order.
func AllowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("reading CPU affinity: %w", err)
	}
	var cpus []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) == 0 {
		return nil, fmt.Errorf("this process may run on no CPU")
	}
	return cpus, nil
}

// SplitCores assigns cpus to engines engines, in order, as contiguous runs.
//
// With perEngine > 0 each engine gets exactly that many; asking for more
// than there are is an error, since overlapping engines would fight over
// cores and skew every measurement. With perEngine == 0 the cores are split
// evenly and the remainder goes to the first engines (the prefill engines,
// listed first: prefill is compute-bound and gains the most from a core).
// With fewer cores than engines each engine gets one core and engines share
// cores round-robin; that works but the engines slow each other down.
func SplitCores(cpus []int, engines, perEngine int) ([][]int, error) {
	if engines <= 0 {
		return nil, fmt.Errorf("no engines to place")
	}
	if len(cpus) == 0 {
		return nil, fmt.Errorf("no CPUs to place engines on")
	}
	if perEngine < 0 {
		return nil, fmt.Errorf("threads per engine %d: want 0 (split evenly) or more", perEngine)
	}
	out := make([][]int, engines)
	if perEngine > 0 {
		if perEngine*engines > len(cpus) {
			return nil, fmt.Errorf("%d engines × %d threads need %d cores but this process may use %d: lower --threads-per-engine or run fewer engines",
				engines, perEngine, perEngine*engines, len(cpus))
		}
		for i := range out {
			out[i] = append([]int(nil), cpus[i*perEngine:(i+1)*perEngine]...)
		}
		return out, nil
	}
	if engines > len(cpus) {
		for i := range out {
			out[i] = []int{cpus[i%len(cpus)]}
		}
		return out, nil
	}
	base, extra := len(cpus)/engines, len(cpus)%engines
	next := 0
	for i := range out {
		n := base
		if i < extra {
			n++
		}
		out[i] = append([]int(nil), cpus[next:next+n]...)
		next += n
	}
	return out, nil
}
