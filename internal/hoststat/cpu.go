package hoststat

import (
	"strconv"
	"strings"
)

// UserHZ is the kernel's clock tick for /proc CPU times (USER_HZ, 100 on
// every Linux architecture Go supports but alpha and ia64).
const UserHZ = 100

// ParseStat reads the aggregate "cpu" line of a /proc/stat text: busy and
// total jiffies over all cores (idle and iowait are not busy; guest time
// is already in user and nice).
func ParseStat(s string) (busy, total uint64, ok bool) {
	line, _, _ := strings.Cut(s, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, false
	}
	for i, v := range f[1:] {
		if i >= 8 { // guest and guest_nice are counted in user and nice
			break
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total, true
}

// ParsePIDStat reads utime + stime (clock ticks, UserHZ a second) from a
// /proc/PID/stat text; the command name in parentheses may hold spaces and
// parentheses, so fields count from the last ')'.
func ParsePIDStat(s string) (ticks uint64, ok bool) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return u + st, true
}
