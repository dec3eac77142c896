package server

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCgroupMemoryLimit(t *testing.T) {
	write := func(t *testing.T, path, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name  string
		self  string
		files map[string]string
		want  uint64
	}{
		{"a v2 container's own limit", "0::/kubepods/pod1/c1\n",
			map[string]string{"kubepods/pod1/c1/memory.max": "536870912\n", "kubepods/memory.max": "max\n"}, 512 << 20},
		{"a v2 limit on an ancestor (the pod) applies to the container", "0::/kubepods/pod1/c1\n",
			map[string]string{"kubepods/pod1/c1/memory.max": "max\n", "kubepods/pod1/memory.max": "1073741824\n"}, 1 << 30},
		{"v2 without a limit anywhere", "0::/user.slice\n", map[string]string{"user.slice/memory.max": "max\n"}, 0},
		{"v1 memory controller", "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n",
			map[string]string{"memory/docker/abc/memory.limit_in_bytes": "268435456\n"}, 256 << 20},
		{"v1 without a limit reports a huge number, which is no limit", "4:memory:/\n",
			map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			self := filepath.Join(t.TempDir(), "cgroup")
			write(t, self, tt.self)
			for p, d := range tt.files {
				write(t, filepath.Join(root, p), d)
			}
			if got := cgroupMemoryLimit(self, root); got != tt.want {
				t.Fatalf("limit %d, want %d", got, tt.want)
			}
		})
	}
	t.Run("a missing cgroup file is no limit", func(t *testing.T) {
		if got := cgroupMemoryLimit(filepath.Join(t.TempDir(), "none"), t.TempDir()); got != 0 {
			t.Fatalf("limit %d", got)
		}
	})
}

func TestDefaultNumBlocks(t *testing.T) {
	cases := []struct {
		name                                string
		blockBytes, blockSize, seqs, maxLen int
		ram                                 uint64
		want                                int
	}{
		{"room for every sequence at full length", 20480, 16, 64, 512, 64 << 30, 64 * 32},
		{"capped at a fifth of RAM", 1 << 20, 16, 64, 2048, 5 << 30, 1024},
		{"never below one full-length sequence", 1 << 20, 16, 64, 2048, 10 << 20, 128},
		{"no cap when RAM is unknown", 1 << 20, 16, 2, 100, 0, 14},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := defaultNumBlocks(c.blockBytes, c.blockSize, c.seqs, c.maxLen, c.ram); got != c.want {
				t.Errorf("got %d, want %d", got, c.want)
			}
		})
	}
}
