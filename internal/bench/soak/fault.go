package soak

import (
	"fmt"
	"time"
)

// FaultKind is what is done to an engine.
type FaultKind string

// The faults a soak injects.
const (
	// Kill is kill -9 and a restart on the same ports.
	Kill FaultKind = "kill -9 + restart"
	// Stall is SIGSTOP, a wait, then SIGCONT.
	Stall FaultKind = "SIGSTOP/SIGCONT"
)

// Fault is one scheduled fault.
type Fault struct {
	At     time.Duration // offset from the start of the load
	Kind   FaultKind
	Engine string        // e.g. "prefill-0"
	Stall  time.Duration // for Stall: how long the engine stays stopped
}

// String is the fault's line in the schedule: its offset, kind and engine
// (and a stall's length).
func (f Fault) String() string {
	if f.Kind == Stall {
		return fmt.Sprintf("%6.1fs %s %s for %v", f.At.Seconds(), f.Kind, f.Engine, f.Stall)
	}
	return fmt.Sprintf("%6.1fs %s %s", f.At.Seconds(), f.Kind, f.Engine)
}

// Schedule returns the faults of a run of the given duration, one every
// `every` starting at `every`, none in the last `every` (so the last one
// recovers before the load stops). Faults alternate between the prefill
// and the decode engines, and per role between kill and stall, and move to
// the next engine of a role every two faults of it:
// kill p0, kill d0, stall p0, stall d0, kill p1, kill d1, stall p1, stall d1, …
func Schedule(duration, every, stall time.Duration, prefill, decode []string) []Fault {
	if every <= 0 || len(prefill) == 0 || len(decode) == 0 {
		return nil
	}
	var out []Fault
	for i := 0; ; i++ {
		at := time.Duration(i+1) * every
		if at+every > duration && i > 0 || at >= duration {
			break
		}
		names := prefill
		if i%2 == 1 {
			names = decode
		}
		f := Fault{At: at, Kind: Kill, Engine: names[(i/4)%len(names)]}
		if (i+i/2)%2 == 1 {
			f.Kind, f.Stall = Stall, stall
		}
		out = append(out, f)
	}
	return out
}
