package main

import "testing"

func TestByteSize(t *testing.T) {
	cases := []struct {
		in   string
		want int64
		err  bool
	}{
		{"1024", 1024, false},
		{"512MiB", 512 << 20, false},
		{"1GiB", 1 << 30, false},
		{"1.5GiB", 3 << 29, false},
		{"2GB", 2e9, false},
		{"64K", 64 << 10, false},
		{"10 MiB", 10 << 20, false},
		{"lots", 0, true},
		{"-1MiB", 0, true},
		{"", 0, true},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			var b byteSize
			err := b.Set(c.in)
			if (err != nil) != c.err || int64(b) != c.want {
				t.Errorf("Set(%q) = %d, %v; want %d, error %v", c.in, b, err, c.want, c.err)
			}
		})
	}
}
