package server

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// defaultNumBlocks sizes the KV cache when no flag does: room for
// maxNumSeqs sequences of the full context, capped at 20% of RAM, and never
// less than one full-length sequence. ram 0 means unknown (no cap).
func defaultNumBlocks(blockBytes, blockSize, maxNumSeqs, maxModelLen int, ram uint64) int {
	perSeq := (maxModelLen + blockSize - 1) / blockSize
	n := perSeq * maxNumSeqs
	if ram > 0 && blockBytes > 0 {
		n = min(n, int(ram/5/uint64(blockBytes)))
	}
	return max(n, perSeq)
}

// totalRAM is the memory this process may use in bytes: the machine's
// physical memory, or the cgroup's memory limit when that is lower (a
// container's limit: sizing the KV cache from the node's memory would get
// the pod OOM-killed). 0 means unknown.
func totalRAM() uint64 {
	ram := physicalRAM()
	if lim := cgroupMemoryLimit("/proc/self/cgroup", "/sys/fs/cgroup"); lim > 0 && (ram == 0 || lim < ram) {
		return lim
	}
	return ram
}

// physicalRAM is MemTotal of /proc/meminfo in bytes, or 0 if unknown.
func physicalRAM() uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// cgroupMemoryLimit is the memory limit of this process's cgroup in bytes
// (cgroup v2 memory.max of its own cgroup or the nearest limited ancestor
// below root; cgroup v1 memory.limit_in_bytes), or 0 when there is none or
// it cannot be read.
func cgroupMemoryLimit(selfCgroup, root string) uint64 {
	b, err := os.ReadFile(selfCgroup)
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		// hierarchy-ID:controllers:path
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "": // cgroup v2
			for dir := filepath.Join(root, f[2]); strings.HasPrefix(dir, root) && dir != root; dir = filepath.Dir(dir) {
				if v := readLimit(filepath.Join(dir, "memory.max")); v > 0 {
					return v
				}
			}
			if v := readLimit(filepath.Join(root, "memory.max")); v > 0 {
				return v
			}
		case slices.Contains(strings.Split(f[1], ","), "memory"): // cgroup v1
			for _, p := range []string{filepath.Join(root, "memory", f[2], "memory.limit_in_bytes"), filepath.Join(root, "memory", "memory.limit_in_bytes")} {
				// v1 reports "no limit" as a huge number near 2^63.
				if v := readLimit(p); v > 0 && v < 1<<62 {
					return v
				}
			}
		}
	}
	return 0
}

// readLimit reads a cgroup limit file: a byte count, or "max" (no limit,
// 0).
func readLimit(path string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0
	}
	return v
}
