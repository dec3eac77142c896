package httpguard

import (
	"fmt"
	"io"
	"unicode/utf8"
)

// InvalidUTF8Error is the error of a UTF8Body at the first byte that is
// not UTF-8.
type InvalidUTF8Error struct {
	// Offset is the position in the body of the first byte of the invalid
	// sequence (for a body cut inside a character, of that character).
	Offset int64
}

// Error implements error.
func (e *InvalidUTF8Error) Error() string {
	return fmt.Sprintf("the body is not valid UTF-8 (at byte %d); JSON must be UTF-8 (RFC 8259): re-encode the request as UTF-8", e.Offset)
}

// UTF8Body returns rc read through a check that every byte is UTF-8: a
// Read fails with *InvalidUTF8Error at the first invalid sequence, and at
// EOF when the body ends inside a character. Bytes are passed on as they
// arrive, so the check costs no copy of the body; a reader of the whole body
// (io.ReadAll, then json.Unmarshal) gets the error in place of the body.
func UTF8Body(rc io.ReadCloser) io.ReadCloser {
	if rc == nil {
		return nil
	}
	return &utf8Body{rc: rc}
}

type utf8Body struct {
	rc   io.ReadCloser
	off  int64 // body bytes before pend
	pend [utf8.UTFMax]byte
	np   int   // bytes of an unfinished character at the end of what was read
	err  error // the check's error, sticky
}

func (u *utf8Body) Close() error { return u.rc.Close() }

func (u *utf8Body) Read(p []byte) (int, error) {
	if u.err != nil {
		return 0, u.err
	}
	n, err := u.rc.Read(p)
	if cerr := u.check(p[:n]); cerr != nil {
		u.err = cerr
		return 0, cerr
	}
	if err == io.EOF && u.np > 0 {
		u.err = &InvalidUTF8Error{Offset: u.off}
		return 0, u.err
	}
	return n, err
}

// check validates b, the bytes that follow the np pending ones, and keeps
// an unfinished character at b's end pending for the next call.
func (u *utf8Body) check(b []byte) error {
	if u.np > 0 {
		// Finish the pending character with b's first bytes.
		k := 0
		for u.np < utf8.UTFMax && k < len(b) && !utf8.FullRune(u.pend[:u.np]) {
			u.pend[u.np] = b[k]
			u.np++
			k++
		}
		if !utf8.FullRune(u.pend[:u.np]) {
			return nil // b ended first; still pending
		}
		r, size := utf8.DecodeRune(u.pend[:u.np])
		if r == utf8.RuneError && size <= 1 {
			return &InvalidUTF8Error{Offset: u.off}
		}
		// size < np only when b's bytes ran past the character, which
		// FullRune's stop rules out; the character is exactly pend[:np].
		u.off += int64(size)
		u.np = 0
		b = b[k:]
	}
	// Hold back an unfinished character at the end: the last byte that can
	// start one, if the bytes from it do not yet make a full character.
	tail := len(b)
	for i := len(b) - 1; i >= 0 && i >= len(b)-(utf8.UTFMax-1); i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				tail = i
			}
			break
		}
	}
	if !utf8.Valid(b[:tail]) {
		return &InvalidUTF8Error{Offset: u.off + int64(firstInvalid(b[:tail]))}
	}
	u.off += int64(tail)
	u.np = copy(u.pend[:], b[tail:])
	return nil
}

// firstInvalid returns the index of the first invalid sequence in b.
func firstInvalid(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return len(b)
}
