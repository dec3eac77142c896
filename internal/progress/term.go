package progress

import (
	"os"
	"strconv"
)

// IsTerminal reports whether f is a terminal: a character device (the fd's
// mode) that answers the terminal window-size request, so /dev/null, also a
// character device, is not one.
func IsTerminal(f *os.File) bool {
	if f == nil {
		return false
	}
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	_, ok := winsize(f)
	return ok
}

// termWidth is f's width in columns: the terminal's, else $COLUMNS, else 80.
func termWidth(f *os.File) int {
	if cols, ok := winsize(f); ok && cols > 0 {
		return cols
	}
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		return n
	}
	return 80
}
