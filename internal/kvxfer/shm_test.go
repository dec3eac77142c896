package kvxfer

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestShmMapsOnlyTheProducersSealedMemfd: a producer that passed the
// handshake but offers something other than its own sealed pool memfd is
// refused before anything is mapped, and the consumer keeps working.
func TestShmMapsOnlyTheProducersSealedMemfd(t *testing.T) {
	pid := os.Getpid()
	regular, err := os.CreateTemp(t.TempDir(), "not-a-pool")
	if err != nil {
		t.Fatal(err)
	}
	defer regular.Close()
	regular.Truncate(1 << 20)
	unsealedFD, err := unix.MemfdCreate("tandem-kv", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	unsealed := os.NewFile(uintptr(unsealedFD), "unsealed")
	defer unsealed.Close()
	unsealed.Truncate(1 << 20)
	// A sealed memfd of the right geometry, for the negative control.
	good := newTestPool(t, 4, tiny)

	stat := func(f *os.File) (uint64, uint64) {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		return uint64(st.Dev), st.Ino
	}
	tests := []struct {
		name string
		path string
		file *os.File
		pid  int
		want string
	}{
		{"a path outside /proc/<pid>/fd", regular.Name(), regular, pid, "not a descriptor of its own process"},
		{"another process's descriptor", fmt.Sprintf("/proc/1/fd/%d", regular.Fd()), regular, pid, "not a descriptor of its own process"},
		{"a regular file among its descriptors", fmt.Sprintf("/proc/%d/fd/%d", pid, regular.Fd()), regular, pid, "not an anonymous memory file"},
		{"a memfd that can shrink", fmt.Sprintf("/proc/%d/fd/%d", pid, unsealedFD), unsealed, pid, "can shrink"},
		{"no pid", good.layout().Path, nil, 0, "not a descriptor of its own process"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			info := tiny
			info.EngineID = "liar"
			info.NumBlocks = 4
			info.Pid = tc.pid
			info.Host = LocalHost()
			info.Shm = *good.layout()
			info.Shm.Path = tc.path
			if tc.file != nil {
				info.Shm.Dev, info.Shm.Inode = stat(tc.file)
			}
			_, peer := newFakeProducer(t, info, func(net.Conn, header, []byte) bool { return false })
			ci := tiny
			ci.EngineID = "d"
			c, _ := NewConsumer(ConsumerConfig{Local: ci, Transport: TransportShm, Secret: testSecret, Logger: discardLogger()})
			defer c.Close()
			err := c.Pull(ctxT(t), RemoteParams{EngineID: "liar", RequestID: "r", Host: peer.Host, Port: peer.Port, BlockIDs: []int{0}}, newLocalBlocks(1, tiny.BlockBytes))
			wantErr(t, err, nil, tc.want)
		})
	}
	// The same consumer setup maps an honest producer's pool.
	r := newRig(t, rigOpts{transport: TransportShm})
	r.hold(t, "req-a", 1)
	dst := newLocalBlocks(1, tiny.BlockBytes)
	if err := r.cons.Pull(ctxT(t), r.params("req-a", 1), dst); err != nil {
		t.Fatal(err)
	}
	checkBlocks(t, r.pool, []int{1}, dst)
}

// TestCopyFromATruncatedMappingFailsInsteadOfCrashing: if a mapping loses
// its pages anyway, the copy returns an error rather than SIGBUS.
func TestCopyFromATruncatedMappingFailsInsteadOfCrashing(t *testing.T) {
	fd, err := unix.MemfdCreate("truncated", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	const size = 1 << 16
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if err := unix.Ftruncate(fd, 0); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, size)
	err = copyNoFault(dst, mem)
	if err == nil || !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "faulted") {
		t.Fatalf("copy from a truncated mapping: %v", err)
	}
	// The goroutine's fault mode is restored.
	if err := copyNoFault(dst[:8], make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
}
