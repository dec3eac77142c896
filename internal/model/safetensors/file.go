package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/tandem-serve/tandem/internal/hugemem"
)

// Tensor is one tensor of an open file. Data aliases the read-only memory
// mapping: it must not be written, and it is invalid after the file is
// closed.
type Tensor struct {
	Info
	// File is the path of the file holding the tensor.
	File string
	// Data holds the tensor's raw little-endian bytes.
	Data []byte
}

// File is a safetensors file loaded into memory.
type File struct {
	path   string
	mapped []byte
	header *Header
	byName map[string]int
}

// Open loads the file at path into a read-only anonymous memory mapping and
// parses its header.
//
// The bytes are read into anonymous memory rather than used through a
// MAP_SHARED mapping of the file: on the VMs Tandem is measured on, a
// kernel memory monitor (DAMON with a pageout scheme) slows every read of
// file-backed pages 5–10× for ~150 ms every 500 ms, which made one decode
// step in eight take 100–170 ms instead of 20; the same reads from
// anonymous memory never stall (docs/performance.md). The cost is one copy
// at load time (about 0.1 s per GB) and no sharing of weights through the
// page cache between engine processes.
func Open(path string) (*File, error) { return open(path, nil) }

// open is Open adding the bytes it reads to c (nil: none).
func open(path string, c *readCounter) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	size := st.Size()
	var prefix [8]byte
	if _, err := io.ReadFull(f, prefix[:]); err != nil {
		return nil, fmt.Errorf("safetensors: %s: file too short: need at least 8 bytes for the header length, found %d", path, size)
	}
	if _, err := ParseHeader(prefix[:], size); err != nil {
		if _, ok := errors.AsType[*NeedError](err); !ok {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	if size > int64(^uint(0)>>1) {
		return nil, fmt.Errorf("safetensors: %s: %d bytes cannot be mapped on this platform", path, size)
	}
	mapped, err := loadAnonymous(f, path, size, c)
	if err != nil {
		return nil, err
	}
	h, err := ParseHeader(mapped, size)
	if err != nil {
		_ = hugemem.Unmap(mapped)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	file := &File{path: path, mapped: mapped, header: h, byName: make(map[string]int, len(h.Tensors))}
	for i, t := range h.Tensors {
		file.byName[t.Name] = i
	}
	return file, nil
}

// Path returns the path the file was opened from.
func (f *File) Path() string { return f.path }

// Header returns the parsed header.
func (f *File) Header() *Header { return f.header }

// Tensor returns the named tensor and whether it exists.
func (f *File) Tensor(name string) (Tensor, bool) {
	i, ok := f.byName[name]
	if !ok || f.mapped == nil {
		return Tensor{}, false
	}
	info := f.header.Tensors[i]
	start := f.header.DataStart + info.Begin
	end := f.header.DataStart + info.End
	return Tensor{Info: info, File: f.path, Data: f.mapped[start:end:end]}, true
}

// Memory returns the mapping the file was read into (hugemem's; nil once
// closed).
func (f *File) Memory() []byte { return f.mapped }

// Close unmaps the file. Tensors obtained from it must not be used
// afterwards.
func (f *File) Close() error {
	if f.mapped == nil {
		return nil
	}
	err := hugemem.Unmap(f.mapped)
	f.mapped = nil
	if err != nil {
		return fmt.Errorf("safetensors: %s: %w", f.path, err)
	}
	return nil
}

// IndexFile is the name of the shard index of a sharded checkpoint.
const IndexFile = "model.safetensors.index.json"

// SingleFile is the name of an unsharded checkpoint.
const SingleFile = "model.safetensors"

// Set is the tensors of a checkpoint directory, one file or several shards.
type Set struct {
	files  []*File
	byName map[string]*File
}

// OpenDir opens the checkpoint in dir: the shards listed by
// model.safetensors.index.json if it exists, otherwise model.safetensors.
func OpenDir(dir string) (*Set, error) { return OpenDirProgress(dir, nil) }

// OpenDirProgress is OpenDir telling progress (when not nil) the bytes read
// so far and in all, every shard counted, once before the first read and
// after each piece; the calls come one at a time, from the reading
// goroutines.
func OpenDirProgress(dir string, progress func(read, total int64)) (*Set, error) {
	idxPath := filepath.Join(dir, IndexFile)
	idx, err := os.ReadFile(idxPath)
	switch {
	case err == nil:
		return openShards(dir, idxPath, idx, progress)
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	path := filepath.Join(dir, SingleFile)
	f, err := open(path, newReadCounter(progress, path))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("safetensors: %s has neither %s nor %s: %w", dir, SingleFile, IndexFile, err)
		}
		return nil, err
	}
	s := &Set{files: []*File{f}, byName: make(map[string]*File)}
	for _, t := range f.header.Tensors {
		s.byName[t.Name] = f
	}
	return s, nil
}

func openShards(dir, idxPath string, idx []byte, progress func(read, total int64)) (*Set, error) {
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(idx, &index); err != nil {
		return nil, fmt.Errorf("safetensors: %s: expected {\"weight_map\": {tensor: file}}: %w", idxPath, err)
	}
	if len(index.WeightMap) == 0 {
		return nil, fmt.Errorf("safetensors: %s: weight_map is empty", idxPath)
	}
	s := &Set{byName: make(map[string]*File, len(index.WeightMap))}
	shards := map[string]*File{}
	names := make([]string, 0, len(index.WeightMap))
	for name := range index.WeightMap {
		names = append(names, name)
	}
	sort.Strings(names)
	var c *readCounter
	if progress != nil {
		var paths []string
		for _, shard := range index.WeightMap {
			if p := filepath.Join(dir, filepath.Base(shard)); !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
		}
		c = newReadCounter(progress, paths...)
	}
	for _, name := range names {
		shard := index.WeightMap[name]
		if shard == "" || filepath.Base(shard) != shard {
			s.Close()
			return nil, fmt.Errorf("safetensors: %s: tensor %q maps to %q, expected a file name in the same directory", idxPath, name, shard)
		}
		f, ok := shards[shard]
		if !ok {
			var err error
			f, err = open(filepath.Join(dir, shard), c)
			if err != nil {
				s.Close()
				return nil, err
			}
			shards[shard] = f
			s.files = append(s.files, f)
		}
		if _, ok := f.byName[name]; !ok {
			s.Close()
			return nil, fmt.Errorf("safetensors: %s lists tensor %q in %s, but that file does not contain it", idxPath, name, shard)
		}
		s.byName[name] = f
	}
	return s, nil
}

// Tensor returns the named tensor and whether it exists.
func (s *Set) Tensor(name string) (Tensor, bool) {
	f, ok := s.byName[name]
	if !ok {
		return Tensor{}, false
	}
	return f.Tensor(name)
}

// Names returns the names of all tensors, sorted.
func (s *Set) Names() []string {
	names := make([]string, 0, len(s.byName))
	for n := range s.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Files returns the open files in the order they were opened.
func (s *Set) Files() []*File { return s.files }

// Close unmaps every file and returns the first error.
func (s *Set) Close() error {
	var first error
	for _, f := range s.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// readChunk is the size of one read of loadAnonymous: a few per reader in
// flight keeps the page-fault work of fresh memory spread over threads.
const readChunk = 32 << 20

// loadAnonymous reads the whole file into a fresh anonymous mapping (in
// huge pages where the kernel offers them: package hugemem) and makes it
// read-only, so tensors alias memory nothing can write.
//
// Nearly all of a load's time is the kernel faulting in fresh pages, so
// the file is read by up to four threads in readChunk pieces.
func loadAnonymous(f *os.File, path string, size int64, c *readCounter) ([]byte, error) {
	if size == 0 {
		return nil, fmt.Errorf("safetensors: %s is empty", path)
	}
	mem, err := hugemem.Map(int(size))
	if err != nil {
		return nil, fmt.Errorf("safetensors: allocate %d bytes for %s: %w", size, path, err)
	}
	if err := readParallel(f, mem, min(4, max(2, runtime.GOMAXPROCS(0))), c); err != nil {
		_ = hugemem.Unmap(mem)
		return nil, fmt.Errorf("safetensors: read %s: %w", path, err)
	}
	if err := hugemem.Protect(mem); err != nil {
		_ = hugemem.Unmap(mem)
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	return mem, nil
}

// readParallel fills dst with the file's first len(dst) bytes, readers
// threads each taking the next readChunk in turn, adding each chunk read to
// rc; it returns the first error, io.ErrUnexpectedEOF if the file is
// shorter.
func readParallel(f *os.File, dst []byte, readers int, rc *readCounter) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	chunks := (int64(len(dst)) + readChunk - 1) / readChunk
	for range min(int64(readers), chunks) {
		wg.Go(func() {
			for {
				c := next.Add(1) - 1
				if c >= chunks {
					return
				}
				off := c * readChunk
				part := dst[off:min(off+readChunk, int64(len(dst)))]
				n, err := f.ReadAt(part, off)
				if err != nil && !(errors.Is(err, io.EOF) && n == len(part)) {
					if errors.Is(err, io.EOF) {
						err = io.ErrUnexpectedEOF
					}
					errMu.Lock()
					if first == nil {
						first = err
					}
					errMu.Unlock()
					next.Store(chunks) // the others stop at their next chunk
					return
				}
				rc.add(int64(len(part)))
			}
		})
	}
	wg.Wait()
	return first
}

// readCounter adds up the bytes a load has read for its progress callback,
// one call at a time, so the counts it reports only grow.
type readCounter struct {
	mu          sync.Mutex
	read, total int64
	progress    func(read, total int64)
}

// newReadCounter counts towards the sizes of paths and reports 0 read;
// nil when progress is nil. A file it cannot stat counts 0 (opening it
// reports the error).
func newReadCounter(progress func(read, total int64), paths ...string) *readCounter {
	if progress == nil {
		return nil
	}
	c := &readCounter{progress: progress}
	for _, p := range paths {
		if st, err := os.Stat(p); err == nil {
			c.total += st.Size()
		}
	}
	progress(0, c.total)
	return c
}

func (c *readCounter) add(n int64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.read += n
	c.progress(c.read, c.total)
}
