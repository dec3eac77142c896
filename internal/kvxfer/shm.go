package kvxfer

import (
	"bytes"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/tandem-serve/tandem/internal/kvcache"
	"github.com/tandem-serve/tandem/internal/kvlayout"
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

// shmMapping is a read-only view of a producer's pool file
// (kvcache.Attached). It is reference counted: a pull holds a reference
// while it copies, and drop (restart, TTL eviction, Close) unmaps only after
// the last copy ends, so a copy can never fault on an unmapped range.
type shmMapping struct {
	view      *kvcache.Attached
	numBlocks int

	mu      sync.Mutex
	refs    int
	dropped bool
}

// openShm maps a producer's pool read-only, after checking that it is what
// an honest producer offers and nothing else: a path /proc/<pid>/fd/<n>
// of the authenticated producer's own process (so only a file that process
// holds open can be named), an anonymous memory file (memfd) whose size is
// sealed (so it cannot be truncated under the mapping), with the device and
// inode the producer announced, and a pool header describing exactly the
// geometry of the handshake (checked by kvcache.Attach).
func openShm(info Info) (*shmMapping, error) {
	l := info.Shm
	if err := checkShmPath(l.Path, info.Pid); err != nil {
		return nil, err
	}
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
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("%s is not an anonymous memory file (memfd): refusing to map it", l.Path)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("the prefill's KV pool file %s can shrink (its size is not sealed): refusing to map it", l.Path)
	}
	g, err := geometryOf(info)
	if err != nil {
		return nil, err
	}
	view, err := kvcache.Attach(f, g)
	if err != nil {
		return nil, err
	}
	return &shmMapping{view: view, numBlocks: g.NumBlocks, refs: 1}, nil
}

// checkShmPath accepts only /proc/<pid>/fd/<n> for the producer's pid.
func checkShmPath(path string, pid int) error {
	prefix := "/proc/" + strconv.Itoa(pid) + "/fd/"
	n, ok := strings.CutPrefix(path, prefix)
	if pid <= 0 || !ok || n == "" || strings.Trim(n, "0123456789") != "" {
		return fmt.Errorf("the prefill offers its KV pool at %q, which is not a descriptor of its own process (pid %d): refusing to map it", path, pid)
	}
	return nil
}

// geometryOf is the pool-file geometry a producer's Info describes.
func geometryOf(info Info) (kvcache.Geometry, error) {
	dt, set, err := kvlayout.ParseElemType(info.KVDType)
	if err != nil || !set {
		return kvcache.Geometry{}, fmt.Errorf("the prefill's KV dtype %q is unknown", info.KVDType)
	}
	l := kvlayout.Layout{BlockSize: info.BlockSize, Layers: info.Layers, KVHeads: info.KVHeads, HeadDim: info.HeadDim, DType: dt}
	return kvcache.Geometry{
		Layout:            l,
		NumBlocks:         info.NumBlocks,
		BlockBytes:        info.BlockBytes,
		BlocksOffset:      info.Shm.BlocksOffset,
		GenerationsOffset: info.Shm.GenerationsOffset,
		Size:              info.Shm.Size,
	}, nil
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
		m.view.Close()
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

// copyBlock copies block id out of the mapping into dst. A fault while
// reading the mapping (a file that lost pages despite the checks) becomes
// an error instead of killing the engine with SIGBUS.
func (m *shmMapping) copyBlock(dst []byte, id int) error {
	src, err := m.view.BlockBytes(int32(id))
	if err != nil {
		return err
	}
	return copyNoFault(dst, src)
}

// copyNoFault copies src into dst, turning a memory fault on src into an
// error (debug.SetPanicOnFault for this goroutine, for this copy only).
func copyNoFault(dst, src []byte) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: reading the prefill's KV pool mapping faulted (%v)", ErrProtocol, r)
		}
	}()
	copy(dst, src)
	return nil
}

// generation reads block id's generation counter atomically.
func (m *shmMapping) generation(id int) uint64 {
	g, _ := m.view.Generation(int32(id))
	return g
}

// statShm checks that the pool file exists and is large enough for the
// layout, and records its identity.
func statShm(l ShmLayout, blockBytes, numBlocks int) (ShmLayout, error) {
	fi, err := os.Stat(l.Path)
	if err != nil {
		return l, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return l, fmt.Errorf("stat %s: no device/inode on this platform", l.Path)
	}
	if l.Size == 0 {
		l.Size = fi.Size()
	}
	if err := checkLayout(l, fi.Size(), blockBytes, numBlocks); err != nil {
		return l, err
	}
	l.Dev, l.Inode = uint64(st.Dev), st.Ino
	return l, nil
}

// checkLayout validates a shared-memory layout against the file size and
// pool geometry; it guards every later index into the mapping.
func checkLayout(l ShmLayout, fileSize int64, blockBytes, numBlocks int) error {
	switch {
	case l.Size <= 0 || l.Size != fileSize:
		return fmt.Errorf("pool file %s is %d bytes, layout says %d", l.Path, fileSize, l.Size)
	case l.GenerationsOffset%8 != 0:
		return fmt.Errorf("pool file %s: generation table offset %d is not 8-byte aligned", l.Path, l.GenerationsOffset)
	case l.BlocksOffset < 0 || l.GenerationsOffset < 0,
		numBlocks < 0 || blockBytes <= 0,
		uint64(l.BlocksOffset)+uint64(numBlocks)*uint64(blockBytes) > uint64(l.Size),
		uint64(l.GenerationsOffset)+8*uint64(numBlocks) > uint64(l.Size):
		return fmt.Errorf("pool file %s (%d bytes) cannot hold %d blocks of %d bytes at offset %d and their generations at offset %d", l.Path, l.Size, numBlocks, blockBytes, l.BlocksOffset, l.GenerationsOffset)
	}
	return nil
}
