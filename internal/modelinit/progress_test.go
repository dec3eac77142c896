package modelinit

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/tandem-serve/tandem/internal/model/safetensors"
)

func TestInitReportsTheBytesItWrites(t *testing.T) {
	dir := t.TempDir()
	var calls [][2]int64
	_, err := InitProgress(dir, ShapeTiny, "bf16", 1, func(written, total int64) {
		if n := len(calls); n > 0 && (written < calls[n-1][0] || total != calls[n-1][1]) {
			t.Errorf("report (%d, %d) after %v: want the count to grow against one total", written, total, calls[n-1])
		}
		calls = append(calls, [2]int64{written, total})
	})
	if err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(filepath.Join(dir, safetensors.SingleFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := os.Stat(f.Path())
	if err != nil {
		t.Fatal(err)
	}
	data := st.Size() - f.Header().DataStart
	if len(calls) < 2 {
		t.Fatalf("%d reports, want one before the first tensor and more after", len(calls))
	}
	if first, last := calls[0], calls[len(calls)-1]; first != [2]int64{0, data} || last != [2]int64{data, data} {
		t.Errorf("reports from %v to %v, want from [0 %d] to [%d %d] (the file's tensor data)", first, last, data, data, data)
	}
}
