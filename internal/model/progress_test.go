package model

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/tandem-serve/tandem/internal/tensor"
	"github.com/tandem-serve/tandem/internal/testmodels"
)

// progressCalls records (done, total) reports and checks they only grow.
type progressCalls struct {
	t     *testing.T
	calls [][2]int64
}

func (p *progressCalls) report(done, total int64) {
	if n := len(p.calls); n > 0 && (done < p.calls[n-1][0] || total != p.calls[n-1][1]) {
		p.t.Errorf("report (%d, %d) after (%d, %d): want the count to grow against one total", done, total, p.calls[n-1][0], p.calls[n-1][1])
	}
	p.calls = append(p.calls, [2]int64{done, total})
}

// check wants a first report of 0 and a last of total read.
func (p *progressCalls) check(what string, total int64) {
	p.t.Helper()
	if len(p.calls) < 2 {
		p.t.Fatalf("%s: %d progress reports, want one before and one after reading", what, len(p.calls))
	}
	first, last := p.calls[0], p.calls[len(p.calls)-1]
	if first != [2]int64{0, total} || last != [2]int64{total, total} {
		p.t.Errorf("%s: reports from %v to %v, want from [0 %d] to [%d %d]", what, first, last, total, total, total)
	}
}

func TestLoadReportsTheBytesItReads(t *testing.T) {
	dir := testmodels.Stories260K(t)
	st, err := os.Stat(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	ggufPath := convertGGUF(t, dir, "q8_0")
	for _, tc := range []struct {
		name, path string
		total      int64
	}{
		{"safetensors", dir, st.Size()},
		{"gguf", ggufPath, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &progressCalls{t: t}
			pool := tensor.NewPool(1)
			defer pool.Close()
			m, err := LoadWith(tc.path, pool, LoadOptions{Progress: p.report})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			total := tc.total
			if total < 0 && len(p.calls) > 0 {
				total = p.calls[0][1] // the tensors' bytes: checked against the weights below
				if total < m.WeightBytes() {
					t.Errorf("total %d bytes read, below the model's %d bytes of weights", total, m.WeightBytes())
				}
			}
			p.check(tc.name, total)
		})
	}
}

func TestConvertReportsReadingAndWriting(t *testing.T) {
	dir := testmodels.Stories260K(t)
	st, err := os.Stat(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	read := &progressCalls{t: t}
	var conv []GGUFProgress
	sum, err := ConvertToGGUF(dir, io.Discard, GGUFOptions{Encoding: "q8_0", ReadProgress: read.report,
		Progress: func(p GGUFProgress) { conv = append(conv, p) }})
	if err != nil {
		t.Fatal(err)
	}
	read.check("reading", st.Size())
	var tensors int
	var bytes int64
	for typ := range sum.Tensors {
		tensors += sum.Tensors[typ]
		bytes += sum.Bytes[typ]
	}
	if len(conv) != tensors+1 {
		t.Fatalf("%d conversion reports for %d tensors, want one before and one per tensor", len(conv), tensors)
	}
	if first := conv[0]; first.Tensors != 0 || first.Bytes != 0 || first.TotalTensors != tensors || first.TotalBytes != bytes {
		t.Errorf("first report %+v, want 0 of %d tensors and 0 of %d bytes", first, tensors, bytes)
	}
	if last := conv[len(conv)-1]; last.Tensors != tensors || last.Bytes != bytes {
		t.Errorf("last report %+v, want all %d tensors and %d bytes", last, tensors, bytes)
	}
}
