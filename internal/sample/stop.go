package sample

import "strings"

// StopChecker finds stop strings in generated text that arrives in pieces
// (one detokenized token at a time), where a stop string may straddle
// pieces. It holds back the longest tail of the text that could still be the
// start of a stop string and emits the rest, so text after a stop string is
// never emitted.
//
// The stop string completed first wins, that is the match that ends
// earliest; of two ending at the same byte, the longer. This is what a
// checker fed one byte at a time would see, so the result does not depend on
// how the text is split into tokens.
type StopChecker struct {
	stops       []string
	maxLen      int
	includeStop bool
	pending     string
	stopped     bool
	matched     string
}

// NewStopChecker returns a checker for the non-empty strings in stop. With
// includeStop the matched stop string is part of the emitted text.
func NewStopChecker(stop []string, includeStop bool) *StopChecker {
	c := &StopChecker{includeStop: includeStop}
	for _, s := range stop {
		if s != "" {
			c.stops = append(c.stops, s)
			c.maxLen = max(c.maxLen, len(s))
		}
	}
	return c
}

// Push adds the next piece of text. It returns the text that is now safe to
// emit; stopped is true once a stop string has been found, in which case emit
// ends just before it (or just after it, with includeStop) and matched is the
// stop string. After a stop, Push returns "" and the same stopped and matched.
func (c *StopChecker) Push(text string) (emit string, stopped bool, matched string) {
	if c.stopped {
		return "", true, c.matched
	}
	if len(c.stops) == 0 {
		return text, false, ""
	}
	buf := c.pending + text
	// Matches can only end in the new text: pending held no whole stop.
	from := max(0, len(c.pending)-c.maxLen+1)
	at, which := -1, ""
	for _, s := range c.stops {
		i := strings.Index(buf[from:], s) // s's first match ends earliest
		if i < 0 {
			continue
		}
		i += from
		if end, bestEnd := i+len(s), at+len(which); at < 0 || end < bestEnd || (end == bestEnd && i < at) {
			at, which = i, s
		}
	}
	if at >= 0 {
		c.stopped, c.matched, c.pending = true, which, ""
		end := at
		if c.includeStop {
			end += len(which)
		}
		return buf[:end], true, which
	}
	hold := c.partialSuffix(buf)
	c.pending = buf[len(buf)-hold:]
	return buf[:len(buf)-hold], false, ""
}

// partialSuffix returns the length of the longest proper suffix of buf that
// is a prefix of some stop string.
func (c *StopChecker) partialSuffix(buf string) int {
	for k := min(len(buf), c.maxLen-1); k > 0; k-- {
		tail := buf[len(buf)-k:]
		for _, s := range c.stops {
			if len(s) > k && strings.HasPrefix(s, tail) {
				return k
			}
		}
	}
	return 0
}

// Flush returns the held-back text at the end of generation (none after a
// stop) and resets the hold.
func (c *StopChecker) Flush() string {
	p := c.pending
	c.pending = ""
	return p
}

// Stopped reports whether a stop string was found, and which.
func (c *StopChecker) Stopped() (bool, string) { return c.stopped, c.matched }
