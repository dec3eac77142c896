package gguf

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/tandem-serve/tandem/internal/gguf/ggufspec"
	"github.com/tandem-serve/tandem/internal/tensor"
)

// sampleKV has one pair of every value type.
func sampleKV() []KV {
	return []KV{
		{"general.architecture", StringValue("llama")},
		{"general.alignment", Uint32Value(64)},
		{"t.u8", Uint8Value(200)},
		{"t.i8", Int8Value(-100)},
		{"t.u16", Uint16Value(60000)},
		{"t.i16", Int16Value(-30000)},
		{"t.u32", Uint32Value(4000000000)},
		{"t.i32", Int32Value(-2000000000)},
		{"t.f32", Float32Value(1e-5)},
		{"t.bool", BoolValue(true)},
		{"t.u64", Uint64Value(1 << 63)},
		{"t.i64", Int64Value(-1 << 62)},
		{"t.f64", Float64Value(math.Pi)},
		{"t.strings", ArrayValue([]string{"a", "", "▁the", "<0x0A>"})},
		{"t.f32s", ArrayValue([]float32{0, -1.5, 3})},
		{"t.i32s", ArrayValue([]int32{1, 3, 6})},
		{"t.u8s", ArrayValue([]uint8{1, 2})},
		{"t.i8s", ArrayValue([]int8{-1})},
		{"t.u16s", ArrayValue([]uint16{7})},
		{"t.i16s", ArrayValue([]int16{-7})},
		{"t.u32s", ArrayValue([]uint32{9, 10})},
		{"t.u64s", ArrayValue([]uint64{1 << 40})},
		{"t.i64s", ArrayValue([]int64{-1 << 40})},
		{"t.f64s", ArrayValue([]float64{0.25})},
		{"t.bools", ArrayValue([]bool{true, false})},
		{"t.empty", ArrayValue([]string{})},
	}
}

// sampleTensors has one tensor of every supported type.
func sampleTensors() []TensorInfo {
	return []TensorInfo{
		{Name: "f32", Type: F32, Dims: []int64{3, 2}},
		{Name: "f16", Type: F16, Dims: []int64{5}},
		{Name: "bf16", Type: BF16, Dims: []int64{2, 2, 2}},
		{Name: "q8_0", Type: Q8_0, Dims: []int64{64, 3}},
		{Name: "q4_0", Type: Q4_0, Dims: []int64{32, 1, 2, 1}},
		{Name: "q4_k", Type: Q4_K, Dims: []int64{256, 2}},
		{Name: "q5_k", Type: Q5_K, Dims: []int64{512}},
		{Name: "q6_k", Type: Q6_K, Dims: []int64{256, 1}},
	}
}

func tensorBytes(t TensorInfo) []byte {
	b := make([]byte, t.Size)
	for i := range b {
		b[i] = byte(len(t.Name)*31 + i*7)
	}
	return b
}

func writeSample(t testing.TB) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, sampleKV(), sampleTensors())
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range w.Tensors() {
		data := tensorBytes(ti)
		// Two writes per tensor, to exercise split writes.
		if _, err := w.Write(data[:len(data)/2]); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(data[len(data)/2:]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestWriteReadRoundTrip(t *testing.T) {
	data := writeSample(t)
	f, err := Read(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != 3 || f.Alignment != 64 || f.DataOffset%64 != 0 || int64(len(data))%64 != 0 {
		t.Errorf("version %d, alignment %d, data offset %d, size %d", f.Version, f.Alignment, f.DataOffset, len(data))
	}
	want := sampleKV()
	if len(f.KV) != len(want) {
		t.Fatalf("%d pairs, want %d", len(f.KV), len(want))
	}
	for i, p := range want {
		got := f.KV[i]
		if got.Key != p.Key || got.Value.String() != p.Value.String() || got.Value.Type() != p.Value.Type() || got.Value.ElemType() != p.Value.ElemType() {
			t.Errorf("pair %d: got %s = %s %s, want %s = %s %s", i, got.Key, got.Value.Type(), got.Value, p.Key, p.Value.Type(), p.Value)
		}
	}
	if s, ok := ArrayOf[string](mustGet(t, f, "t.strings")); !ok || !slices.Equal(s, []string{"a", "", "▁the", "<0x0A>"}) {
		t.Errorf("t.strings = %q", s)
	}
	if x, ok := mustGet(t, f, "t.u64").Uint(); !ok || x != 1<<63 {
		t.Errorf("t.u64 = %d", x)
	}
	if x, ok := mustGet(t, f, "t.i8").Int(); !ok || x != -100 {
		t.Errorf("t.i8 = %d", x)
	}
	if _, ok := mustGet(t, f, "t.i8").Uint(); ok {
		t.Error("a negative int8 read as a uint")
	}
	if x, _, err := f.Float("t.f32"); err != nil || float32(x) != 1e-5 {
		t.Errorf("t.f32 = %v, %v", x, err)
	}
	if _, _, err := f.Str("t.u8"); err == nil {
		t.Error("Str of a uint8 did not fail")
	}
	for _, want := range sampleTensors() {
		got, ok := f.Tensor(want.Name)
		if !ok {
			t.Fatalf("tensor %q missing", want.Name)
		}
		if got.Type != want.Type || !slices.Equal(got.Dims, want.Dims) || got.Offset%64 != 0 {
			t.Errorf("tensor %q: %s %v at %d", got.Name, got.Type, got.Dims, got.Offset)
		}
		buf := make([]byte, got.Size)
		if err := f.ReadTensor(got, buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, tensorBytes(*got)) {
			t.Errorf("tensor %q: data differs", got.Name)
		}
		dt, _ := tensor.ParseDType(got.Type.String())
		rb, _ := dt.RowBytes(int(got.Dims[0]))
		if int64(rb)*got.Elements()/got.Dims[0] != got.Size {
			t.Errorf("tensor %q: size %d, want rows × %d", got.Name, got.Size, rb)
		}
	}
	if s := (&TensorInfo{Dims: []int64{3, 2, 5}}).Shape(); !slices.Equal(s, []int{5, 2, 3}) {
		t.Errorf("Shape = %v", s)
	}
}

func mustGet(t *testing.T, f *File, key string) Value {
	t.Helper()
	v, ok := f.Get(key)
	if !ok {
		t.Fatalf("key %q missing", key)
	}
	return v
}

// TestTypesAreTensorDTypes checks that every supported type has the
// blocks of the tensor dtype of the same name.
func TestTypesAreTensorDTypes(t *testing.T) {
	for _, g := range []Type{F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K} {
		d, err := tensor.ParseDType(g.String())
		if err != nil {
			t.Fatal(err)
		}
		ge, gb := g.BlockSize()
		de, db := d.BlockSize()
		if ge != de || gb != db || g.Quantized() != d.Quantized() || !g.Supported() {
			t.Errorf("%s: blocks (%d, %d), tensor %s (%d, %d)", g, ge, gb, d, de, db)
		}
	}
	if Type(3).Supported() || Q8_0.String() != "Q8_0" {
		t.Error("Q4_1 supported")
	}
	if Type(3).String() != "Q4_1" || Type(1000).String() != "type 1000" {
		t.Errorf("names: %s, %s", Type(3), Type(1000))
	}
}

// specFile is a small valid file built byte by byte from the specification,
// with default alignment (no general.alignment key).
func specFile() *ggufspec.Builder {
	b := &ggufspec.Builder{}
	b.Header(3, 2, 3)
	b.KVString("general.architecture", "llama")
	b.KVU32("llama.block_count", 1)
	b.KVStrings("tokenizer.ggml.tokens", []string{"a", "b"})
	b.TensorInfo("w", ggufspec.GF32, []uint64{4, 2}, 0)
	b.TensorInfo("q", ggufspec.GQ8_0, []uint64{32}, 32)
	b.Pad(32)
	b.Raw(ggufspec.F32s([]float32{1, 2, 3, 4, 5, 6, 7, 8}))
	b.Raw(ggufspec.Q8_0(make([]float32, 32)))
	b.Pad(32)
	return b
}

func TestReadSpecFile(t *testing.T) {
	b := specFile()
	f, err := Read(bytes.NewReader(b.B), int64(len(b.B)))
	if err != nil {
		t.Fatal(err)
	}
	if f.Alignment != 32 || len(f.Tensors) != 2 || f.Tensors[1].Size != 34 || f.Tensors[0].Size != 32 {
		t.Fatalf("alignment %d, tensors %+v", f.Alignment, f.Tensors)
	}
	if a, _, _ := f.Str("general.architecture"); a != "llama" {
		t.Errorf("architecture %q", a)
	}
	buf := make([]byte, 32)
	if err := f.ReadTensor(&f.Tensors[0], buf); err != nil || !bytes.Equal(buf, ggufspec.F32s([]float32{1, 2, 3, 4, 5, 6, 7, 8})) {
		t.Errorf("w data %v, %v", buf, err)
	}
	// A version 2 file has the same layout.
	b.B[4] = 2
	if _, err := Read(bytes.NewReader(b.B), int64(len(b.B))); err != nil {
		t.Errorf("version 2: %v", err)
	}
}

func TestOpenAndIsFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.gguf")
	if err := os.WriteFile(path, writeSample(t), 0o644); err != nil {
		t.Fatal(err)
	}
	if !IsFile(path) || IsFile(dir) || IsFile(filepath.Join(dir, "none")) {
		t.Error("IsFile wrong")
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ti, _ := f.Tensor("q8_0")
	buf := make([]byte, ti.Size)
	if err := f.ReadTensor(ti, buf); err != nil || !bytes.Equal(buf, tensorBytes(*ti)) {
		t.Errorf("ReadTensor: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.ReadTensor(ti, buf); err == nil {
		t.Error("ReadTensor after Close did not fail")
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("Open(dir) = %v", err)
	}
}

// badCases are hostile or broken files and a piece of the error each must
// produce.
func badCases() []struct {
	name string
	b    []byte
	want string
} {
	h := func(tensors, kvs uint64) *ggufspec.Builder {
		return (&ggufspec.Builder{}).Header(3, tensors, kvs)
	}
	withTensor := func(name string, typ uint32, dims []uint64, off uint64, data int) []byte {
		b := h(1, 0).TensorInfo(name, typ, dims, off).Pad(32)
		return b.Raw(make([]byte, data)).B
	}
	return []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "not a GGUF file"},
		{"wrong magic", []byte("GGML\x03\x00\x00\x00"), "not a GGUF file"},
		{"version 1", (&ggufspec.Builder{B: []byte("GGUF")}).U32(1).U64(0).U64(0).B, "version 1"},
		{"big endian", (&ggufspec.Builder{B: []byte("GGUF")}).U32(3 << 24).U64(0).U64(0).B, "big-endian"},
		{"unknown version", (&ggufspec.Builder{B: []byte("GGUF")}).U32(9).U64(0).U64(0).B, "unknown version 9"},
		{"huge tensor count", h(1<<60, 0).B, "claims 1152921504606846976 tensors"},
		{"huge kv count", h(0, 1<<62).B, "claims 4611686018427387904 metadata pairs"},
		{"huge key length", h(0, 1).U64(1 << 40).Raw(make([]byte, 16)).B, "more than the limit"},
		{"key past the end", h(0, 1).U64(100).Raw(make([]byte, 16)).B, "file truncated"},
		{"empty key", h(0, 1).Str("").U32(ggufspec.TUint8).U8(0).Raw(make([]byte, 16)).B, "empty key"},
		{"duplicate key", h(0, 2).KVU32("a", 1).KVU32("a", 2).B, `"a" appears twice`},
		{"unknown value type", h(0, 1).Str("k").U32(99).Raw(make([]byte, 16)).B, "unknown value type 99"},
		{"bad bool", h(0, 1).Str("k").U32(ggufspec.TBool).U8(2).B, "neither 0 nor 1"},
		{"huge string", h(0, 1).Str("k").U32(ggufspec.TString).U64(1 << 62).B, "more than the limit"},
		{"string past the end", h(0, 1).Str("k").U32(ggufspec.TString).U64(1000).Raw([]byte("xy")).B, "file truncated"},
		{"huge array", h(0, 1).Str("k").U32(ggufspec.TArray).U32(ggufspec.TUint64).U64(1 << 50).B, "more than the limit"},
		{"array past the end", h(0, 1).Str("k").U32(ggufspec.TArray).U32(ggufspec.TUint64).U64(1 << 20).U64(1).B, "file truncated"},
		{"string array past the end", h(0, 1).Str("k").U32(ggufspec.TArray).U32(ggufspec.TString).U64(1 << 20).B, "file truncated"},
		{"nested array", h(0, 1).Str("k").U32(ggufspec.TArray).U32(ggufspec.TArray).U64(1).B, "array of arrays"},
		{"array of unknown type", h(0, 1).Str("k").U32(ggufspec.TArray).U32(77).U64(1).B, "unknown value type 77"},
		{"bad alignment", h(0, 1).KVU32("general.alignment", 24).B, "power of two"},
		{"zero alignment", h(0, 1).KVU32("general.alignment", 0).B, "power of two"},
		{"alignment of the wrong type", h(0, 1).Str("general.alignment").U32(ggufspec.TUint64).U64(32).B, "power of two"},
		{"unsupported tensor type", withTensor("blk.0.attn_q.weight", ggufspec.GQ4_1, []uint64{32}, 0, 64), `tensor "blk.0.attn_q.weight" has type Q4_1 (3), which is not supported`},
		{"unknown tensor type", withTensor("x", 1234, []uint64{1}, 0, 64), "type 1234"},
		{"no dimensions", withTensor("x", ggufspec.GF32, nil, 0, 64), "0 dimensions"},
		{"five dimensions", withTensor("x", ggufspec.GF32, []uint64{1, 1, 1, 1, 1}, 0, 64), "5 dimensions"},
		{"dimension overflow", withTensor("x", ggufspec.GF32, []uint64{1 << 32, 1 << 32}, 0, 64), "overflow"},
		{"negative dimension", withTensor("x", ggufspec.GF32, []uint64{1 << 63}, 0, 64), "overflow"},
		{"byte size overflow", withTensor("x", ggufspec.GF32, []uint64{1 << 31, 1 << 31}, 0, 64), "overflows"},
		{"row not whole blocks", withTensor("x", ggufspec.GQ8_0, []uint64{33}, 0, 64), "not a multiple of the 32-element Q8_0 block"},
		{"misaligned offset", withTensor("x", ggufspec.GF32, []uint64{1}, 4, 64), "not a multiple of the alignment"},
		{"offset past the end", withTensor("x", ggufspec.GF32, []uint64{1}, 1<<40, 64), "run past the end"},
		{"data truncated", withTensor("x", ggufspec.GF32, []uint64{100}, 0, 64), "run past the end"},
		{"huge offset", withTensor("x", ggufspec.GF32, []uint64{1}, 1<<63+32, 64), "not a multiple of the alignment"},
		{"data section past the end", h(1, 0).TensorInfo("x", ggufspec.GF32, []uint64{1}, 0).B, "data section would start"},
		{"tensor name too long", withTensor(strings.Repeat("n", 64), ggufspec.GF32, []uint64{1}, 0, 64), "more than the limit of 63"},
		{"empty tensor name", withTensor("", ggufspec.GF32, []uint64{1}, 0, 64), "empty name"},
		{"duplicate tensor", h(2, 0).TensorInfo("x", ggufspec.GF32, []uint64{1}, 0).TensorInfo("x", ggufspec.GF32, []uint64{1}, 32).Pad(32).Raw(make([]byte, 64)).B, `"x" appears twice`},
		{"overlapping tensors", h(2, 0).TensorInfo("a", ggufspec.GF32, []uint64{16}, 0).TensorInfo("b", ggufspec.GF32, []uint64{8}, 32).Pad(32).Raw(make([]byte, 96)).B, "overlap"},
	}
}

func TestBadFiles(t *testing.T) {
	for _, c := range badCases() {
		t.Run(c.name, func(t *testing.T) {
			f, err := Read(bytes.NewReader(c.b), int64(len(c.b)))
			if err == nil {
				t.Fatalf("no error; read %d tensors, %d pairs", len(f.Tensors), len(f.KV))
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not contain %q", err, c.want)
			}
		})
	}
}

// TestHostileCountsAllocateLittle checks that headers claiming huge counts
// and lengths are refused before anything of their claimed size is
// allocated.
func TestHostileCountsAllocateLittle(t *testing.T) {
	for _, c := range badCases() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range 10 {
			_, _ = Read(bytes.NewReader(c.b), int64(len(c.b)))
		}
		runtime.ReadMemStats(&after)
		if n := (after.TotalAlloc - before.TotalAlloc) / 10; n > 256<<10 {
			t.Errorf("%s: %d bytes allocated per Read of a %d-byte file", c.name, n, len(c.b))
		}
	}
}

// TestTruncatedAnywhere cuts a valid file at every length: each prefix
// must fail cleanly (the whole file must not).
func TestTruncatedAnywhere(t *testing.T) {
	data := writeSample(t)
	whole, err := Read(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	end := whole.DataOffset // the end of the last tensor's data
	for _, ti := range whole.Tensors {
		end = max(end, whole.DataOffset+ti.Offset+ti.Size)
	}
	for n := range len(data) {
		_, err := Read(bytes.NewReader(data[:n]), int64(n))
		if err == nil && int64(n) < end {
			t.Fatalf("a file cut to %d of %d bytes read without error", n, len(data))
		}
		if err != nil && int64(n) >= end {
			t.Fatalf("a file cut to %d bytes, after the last tensor's data (%d), failed: %v", n, end, err)
		}
	}
	// A reader whose ReadAt fails is reported, not a panic.
	if _, err := Read(failingReader{}, 1000); err == nil {
		t.Error("failing reader: no error")
	}
}

type failingReader struct{}

func (failingReader) ReadAt([]byte, int64) (int, error) { return 0, os.ErrClosed }

func TestWriterRejects(t *testing.T) {
	cases := []struct {
		name    string
		kv      []KV
		tensors []TensorInfo
		want    string
	}{
		{"duplicate key", []KV{{"a", Uint8Value(1)}, {"a", Uint8Value(2)}}, nil, "twice"},
		{"empty key", []KV{{"", Uint8Value(1)}}, nil, "must be 1 to"},
		{"bad alignment", []KV{{"general.alignment", Uint64Value(32)}}, nil, "power of two"},
		{"duplicate tensor", nil, []TensorInfo{{Name: "x", Type: F32, Dims: []int64{1}}, {Name: "x", Type: F32, Dims: []int64{1}}}, "twice"},
		{"long name", nil, []TensorInfo{{Name: strings.Repeat("x", 64), Type: F32, Dims: []int64{1}}}, "must be 1 to 63"},
		{"partial block", nil, []TensorInfo{{Name: "x", Type: Q4_K, Dims: []int64{255}}}, "multiple"},
		{"unsupported type", nil, []TensorInfo{{Name: "x", Type: Type(3), Dims: []int64{32}}}, "Q4_1"},
		{"no dims", nil, []TensorInfo{{Name: "x", Type: F32}}, "0 dimensions"},
	}
	for _, c := range cases {
		if _, err := NewWriter(&bytes.Buffer{}, c.kv, c.tensors); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.name, err, c.want)
		}
	}
	var buf bytes.Buffer
	w, err := NewWriter(&buf, nil, []TensorInfo{{Name: "x", Type: F32, Dims: []int64{2}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err == nil {
		t.Error("Close with a tensor half written did not fail")
	}
	if _, err := w.Write(make([]byte, 8)); err == nil {
		t.Error("writing past the last tensor did not fail")
	}
}

func FuzzRead(f *testing.F) {
	f.Add(writeSample(f))
	f.Add(specFile().B)
	for _, c := range badCases() {
		f.Add(c.b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Read(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		// A file that parses must describe only bytes that exist.
		for i := range file.Tensors {
			ti := &file.Tensors[i]
			if ti.Offset < 0 || ti.Size < 0 || file.DataOffset+ti.Offset+ti.Size > int64(len(data)) {
				t.Fatalf("tensor %q (%d bytes at %d) outside a %d-byte file with data at %d", ti.Name, ti.Size, ti.Offset, len(data), file.DataOffset)
			}
			if ti.Size <= 1<<20 {
				if err := file.ReadTensor(ti, make([]byte, ti.Size)); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, kv := range file.KV {
			_ = kv.Value.String()
		}
	})
}
