package kvxfer

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// LocalHost returns this machine's identity: the kernel boot id (new at
// every boot, shared by all containers on one kernel) and the hostname.
// Engines on the same host (equal identities) can share memory, subject to
// the pool file being reachable and identical (device and inode).
var LocalHost = sync.OnceValue(func() HostIdentity {
	var h HostIdentity
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		h.BootID = string(bytes.TrimSpace(b))
	}
	h.Hostname, _ = os.Hostname()
	return h
})

// sameHost reports whether two identities name the same machine. An
// unknown boot id is never the same host: shared memory must be provably
// safe, not assumed.
func sameHost(a, b HostIdentity) bool {
	return a.BootID != "" && a.BootID == b.BootID && a.Hostname == b.Hostname
}

// shmMapping is a read-only mapping of a producer's pool file. It is
// reference counted: a pull holds a reference while it copies, and drop
// (restart, TTL eviction, Close) unmaps only after the last copy ends, so a
// copy can never fault on an unmapped range.
type shmMapping struct {
	layout     ShmLayout
	blockBytes int
	numBlocks  int
	data       []byte

	mu      sync.Mutex
	refs    int
	dropped bool
}

// openShm maps a producer's pool file read-only after checking it is the
// file the producer described (device, inode, size) and that the layout
// fits in it.
func openShm(l ShmLayout, blockBytes, numBlocks int) (*shmMapping, error) {
	f, err := os.Open(l.Path)
	if err != nil {
		return nil, fmt.Errorf("open the prefill's KV pool file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || uint64(st.Dev) != l.Dev || st.Ino != l.Inode {
		return nil, fmt.Errorf("%s here is not the prefill's KV pool file (different device/inode: another mount namespace?)", l.Path)
	}
	if err := checkLayout(l, fi.Size(), blockBytes, numBlocks); err != nil {
		return nil, err
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(l.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s read-only: %w", l.Path, err)
	}
	return &shmMapping{layout: l, blockBytes: blockBytes, numBlocks: numBlocks, data: data, refs: 1}, nil
}

// acquire takes a reference for one copy; false if the mapping was dropped.
func (m *shmMapping) acquire() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dropped {
		return false
	}
	m.refs++
	return true
}

// release drops a reference and unmaps when it was the last.
func (m *shmMapping) release() {
	m.mu.Lock()
	m.refs--
	unmap := m.refs == 0
	m.mu.Unlock()
	if unmap {
		unix.Munmap(m.data)
	}
}

// drop releases the owner's reference; the mapping goes away once no copy
// is using it.
func (m *shmMapping) drop() {
	m.mu.Lock()
	if m.dropped {
		m.mu.Unlock()
		return
	}
	m.dropped = true
	m.mu.Unlock()
	m.release()
}

// block returns block id's bytes in the mapping. Callers check id range.
func (m *shmMapping) block(id int) []byte {
	off := m.layout.BlocksOffset + int64(id)*int64(m.blockBytes)
	return m.data[off : off+int64(m.blockBytes) : off+int64(m.blockBytes)]
}

// generation reads block id's generation counter atomically (the producer
// updates it with an atomic store; offsets are 8-byte aligned and the
// mapping is page aligned).
func (m *shmMapping) generation(id int) uint64 {
	off := m.layout.GenerationsOffset + 8*int64(id)
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&m.data[off])))
}
