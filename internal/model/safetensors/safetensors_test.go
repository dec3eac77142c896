package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeFile(t *testing.T, path string, infos []Info, fill func(i int) byte) {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, infos, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	for ti, info := range infos {
		data := make([]byte, info.Elements()*int64(info.DType.Size()))
		for i := range data {
			data[i] = fill(ti*31 + i)
		}
		// Write in two pieces to exercise split writes.
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
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

var sample = []Info{
	{Name: "a", DType: F32, Shape: []int{2, 3}},
	{Name: "b", DType: BF16, Shape: []int{5}},
	{Name: "empty", DType: F16, Shape: []int{0, 4}},
	{Name: "scalar", DType: I64, Shape: []int{}},
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, SingleFile), sample, func(i int) byte { return byte(i) })
	s, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := strings.Join(s.Names(), ","); got != "a,b,empty,scalar" {
		t.Errorf("Names = %s", got)
	}
	for ti, info := range sample {
		tn, ok := s.Tensor(info.Name)
		if !ok {
			t.Fatalf("tensor %s missing", info.Name)
		}
		if tn.DType != info.DType || len(tn.Shape) != len(info.Shape) || int64(len(tn.Data)) != info.Elements()*int64(info.DType.Size()) {
			t.Errorf("tensor %s = %s %v with %d bytes", info.Name, tn.DType, tn.Shape, len(tn.Data))
		}
		for i, b := range tn.Data {
			if b != byte(ti*31+i) {
				t.Fatalf("tensor %s byte %d = %d, want %d", info.Name, i, b, byte(ti*31+i))
			}
		}
	}
	if md := s.Files()[0].Header().Metadata; md["format"] != "pt" {
		t.Errorf("metadata = %v", md)
	}
	if (s.Files()[0].Header().DataStart)%8 != 0 {
		t.Errorf("data section starts at %d, not 8-byte aligned", s.Files()[0].Header().DataStart)
	}
	if _, ok := s.Tensor("nope"); ok {
		t.Error("found a tensor that does not exist")
	}
}

func TestShards(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "model-00001-of-00002.safetensors"), sample[:2], func(i int) byte { return 1 })
	writeFile(t, filepath.Join(dir, "model-00002-of-00002.safetensors"), sample[2:], func(i int) byte { return 2 })
	index := `{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
		"empty": "model-00002-of-00002.safetensors", "scalar": "model-00002-of-00002.safetensors"}}`
	if err := os.WriteFile(filepath.Join(dir, IndexFile), []byte(index), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(s.Files()) != 2 {
		t.Errorf("opened %d files, want 2", len(s.Files()))
	}
	if tn, ok := s.Tensor("scalar"); !ok || tn.Data[0] != 2 || !strings.HasSuffix(tn.File, "00002-of-00002.safetensors") {
		t.Errorf("scalar = %+v, %t", tn.Info, ok)
	}

	bad := strings.Replace(index, `"b": "model-00001`, `"c": "model-00001`, 1)
	if err := os.WriteFile(filepath.Join(dir, IndexFile), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenDir(dir); err == nil || !strings.Contains(err.Error(), `"c"`) {
		t.Errorf("index naming a tensor its shard lacks: err = %v", err)
	}
	escape := strings.Replace(index, `"a": "model-00001`, `"a": "../model-00001`, 1)
	if err := os.WriteFile(filepath.Join(dir, IndexFile), []byte(escape), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenDir(dir); err == nil || !strings.Contains(err.Error(), "same directory") {
		t.Errorf("index pointing outside the directory: err = %v", err)
	}
}

func header(js string, dataSize int) []byte {
	b := make([]byte, 8, 8+len(js)+dataSize)
	binary.LittleEndian.PutUint64(b, uint64(len(js)))
	b = append(b, js...)
	return append(b, make([]byte, dataSize)...)
}

func TestParseHeaderRejectsCorruptFiles(t *testing.T) {
	cases := []struct {
		name string
		file []byte
		want string
	}{
		{"shorter than the length prefix", []byte{1, 2, 3}, "too short"},
		{"header length past the end", header(`{}`, 0)[:9], "runs past the end"},
		{"huge header length", binary.LittleEndian.AppendUint64(nil, 1<<40), "exceeds the limit"},
		{"not JSON", header(`{"a":`, 0), "not a JSON object"},
		{"unknown dtype", header(`{"t":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}`, 1), `unknown dtype "Q4"`},
		{"missing offsets", header(`{"t":{"dtype":"F32","shape":[1]}}`, 4), "missing"},
		{"negative dimension", header(`{"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, 4), "non-negative"},
		{"shape overflow", header(`{"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}`, 4), "overflows"},
		{"offsets past the data", header(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 4), "outside the 4-byte data section"},
		{"reversed offsets", header(`{"t":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}`, 4), "outside"},
		{"size not matching shape", header(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 8), "needs 8 bytes"},
		{"three offsets", header(`{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, 8), "2 entries"},
		{"overlapping tensors", header(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8), "overlap"},
		{"tensor inside another", header(`{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"c":{"dtype":"U8","shape":[1],"data_offsets":[4,5]}}`, 8), "overlap"},
		{"metadata not strings", header(`{"__metadata__":{"a":1}}`, 0), "__metadata__"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseHeader(tc.file, int64(len(tc.file)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseHeader error = %v, want one containing %q", err, tc.want)
			}
		})
	}
	var need *NeedError
	full := header(`{}`, 0)
	if _, err := ParseHeader(full[:8], int64(len(full))); !errors.As(err, &need) || need.Bytes != int64(len(full)) {
		t.Errorf("short prefix: err = %v, want NeedError for %d bytes", err, len(full))
	}
}

func TestOpenTruncatedFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, SingleFile)
	writeFile(t, path, sample, func(i int) byte { return 0 })
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 7, 8, 20, len(data) - 1} {
		if err := os.WriteFile(path, data[:n], 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := Open(path)
		if err == nil {
			f.Close()
			t.Errorf("Open of the first %d of %d bytes succeeded", n, len(data))
		} else if !strings.Contains(err.Error(), path) {
			t.Errorf("error %q does not name the file", err)
		}
	}
}

func FuzzParseHeader(f *testing.F) {
	var buf bytes.Buffer
	w, _ := NewWriter(&buf, sample, map[string]string{"k": "v"})
	for _, info := range sample {
		w.Write(make([]byte, info.Elements()*int64(info.DType.Size())))
	}
	f.Add(buf.Bytes())
	f.Add(header(`{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"u":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, file []byte) {
		h, err := ParseHeader(file, int64(len(file)))
		if err != nil {
			return
		}
		for _, info := range h.Tensors {
			start, end := h.DataStart+info.Begin, h.DataStart+info.End
			if start < h.DataStart || end > int64(len(file)) || start > end {
				t.Fatalf("tensor %q [%d,%d) escapes the %d-byte file", info.Name, start, end, len(file))
			}
			if end-start != info.Elements()*int64(info.DType.Size()) {
				t.Fatalf("tensor %q size mismatch", info.Name)
			}
			_ = file[start:end]
		}
	})
}
