package httpguard

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
	"unicode/utf8"
)

// chunked reads b in pieces of the given sizes, cycling through them.
type chunked struct {
	b     []byte
	sizes []int
	i     int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(c.b), c.sizes[c.i%len(c.sizes)])
	c.i++
	copy(p, c.b[:n])
	c.b = c.b[n:]
	return n, nil
}

// readChecked reads b through UTF8Body in pieces of sizes.
func readChecked(b []byte, sizes ...int) ([]byte, error) {
	return io.ReadAll(UTF8Body(io.NopCloser(&chunked{b: b, sizes: sizes})))
}

// checkUTF8Body checks UTF8Body on b split every way with pieces of up to
// 5 bytes, and read whole: the bytes unchanged when b is UTF-8, else an
// *InvalidUTF8Error at the first invalid sequence.
func checkUTF8Body(t *testing.T, b []byte) {
	t.Helper()
	want := firstInvalid(b)
	splits := [][]int{{len(b) + 1}, {1}, {2}, {3}, {1, 2}, {2, 3, 1}, {5, 1}}
	for split := 1; split < len(b); split++ {
		splits = append(splits, []int{split, len(b)})
	}
	for _, sizes := range splits {
		got, err := readChecked(b, sizes...)
		if utf8.Valid(b) {
			if err != nil || !bytes.Equal(got, b) {
				t.Fatalf("%q in pieces %v: %q, %v; want it unchanged", b, sizes, got, err)
			}
			continue
		}
		var bad *InvalidUTF8Error
		if !errors.As(err, &bad) {
			t.Fatalf("%q in pieces %v: error %v, want *InvalidUTF8Error", b, sizes, err)
		}
		if bad.Offset != int64(want) {
			t.Fatalf("%q in pieces %v: offset %d, want %d", b, sizes, bad.Offset, want)
		}
	}
}

func TestUTF8Body(t *testing.T) {
	for _, s := range []string{
		"", "a", `{"p":"plain"}`, "héllo", "日本語", "🙂🙂", "\ufffd", "a\u07ffb\uffff\U0010ffff",
		"\xff", "a\xffb", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "abc\xe2",
		"\xf0\x9f\x99", "\x80", "a\x80\x80\x80\x80b", "\xe0\x80\x80", "🙂\xf0\x9f\x99A", "é\xc3",
	} {
		checkUTF8Body(t, []byte(s))
	}
	t.Run("an error is sticky", func(t *testing.T) {
		r := UTF8Body(io.NopCloser(iotest.OneByteReader(bytes.NewReader([]byte("a\xffbc")))))
		if _, err := io.ReadAll(r); err == nil {
			t.Fatal("no error")
		}
		if n, err := r.Read(make([]byte, 8)); n != 0 || err == nil {
			t.Errorf("read after the error: %d, %v", n, err)
		}
	})
	t.Run("a nil body stays nil", func(t *testing.T) {
		if UTF8Body(nil) != nil {
			t.Error("not nil")
		}
	})
}

func FuzzUTF8Body(f *testing.F) {
	for _, s := range []string{"", "héllo", "a\xffb", "\xe2\x82", "🙂\xf0\x9f\x99A", "\xed\xa0\x80"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 64 {
			b = b[:64] // every split of a short input is enough
		}
		checkUTF8Body(t, b)
	})
}
