// Package hugemem maps the large read-mostly memory of a model's weights:
// fresh anonymous mappings, 2 MiB aligned and, on Linux, advised for
// transparent huge pages (MADV_HUGEPAGE).
//
// Decode streams every weight once per token, so the weights' pages decide
// how often the core walks the page tables and where its hardware
// prefetchers start over. On an AMD EPYC Zen 4 (2 vCPUs, THP "madvise",
// defrag "madvise"), one thread decoded llama-1b Q4_K_M and qwen3-0.6b
// Q4_K_M and Q8_0 8–12% faster with their weights in 2 MiB pages (in one
// window 15–17%), and a GGUF load of 803 MB took 0.14–0.22 s instead of
// 0.28–0.50 s (a fault per 2 MiB instead of per 4 KiB; docs/performance.md,
// "Model load"). Where the kernel offers no huge
// pages (THP "never", none free and compaction failing) the mapping is
// plain 4 KiB pages and works the same.
package hugemem

// Align is the alignment of a mapping Map returns: the size of an x86-64
// or arm64 (4 KiB granule) transparent huge page.
const Align = 2 << 20

// roundUp rounds n up to a multiple of Align.
func roundUp(n int) int { return (n + Align - 1) &^ (Align - 1) }
