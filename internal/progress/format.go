package progress

import (
	"fmt"
	"time"
)

// formatBytesOf writes n in the binary unit that suits scale, with "/total"
// when scale is a total other than n: "1.05/2.50 GiB", "312.0 MiB".
func formatBytesOf(n, scale int64) string {
	unit, div, prec := "B", 1.0, 0
	switch {
	case scale >= 1<<30:
		unit, div, prec = "GiB", 1<<30, 2
	case scale >= 1<<20:
		unit, div, prec = "MiB", 1<<20, 1
	case scale >= 1<<10:
		unit, div, prec = "KiB", 1<<10, 1
	}
	if n == scale {
		return fmt.Sprintf("%.*f %s", prec, float64(n)/div, unit)
	}
	return fmt.Sprintf("%.*f/%.*f %s", prec, float64(n)/div, prec, float64(scale)/div, unit)
}

// formatDuration writes d to the second, compactly: "9s", "1m05s", "2h03m";
// under ten seconds to the tenth: "2.5s".
func formatDuration(d time.Duration) string {
	switch {
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}
