package progress

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

// Mode says how progress is shown, as the --progress flag spells it.
type Mode int

const (
	// Auto redraws a line in place when stderr is a terminal (and TERM is
	// not dumb) and writes plain lines otherwise.
	Auto Mode = iota
	// Always redraws a line in place even when stderr is not a terminal
	// (for a CI log viewer that renders carriage returns).
	Always
	// Plain writes plain lines even on a terminal.
	Plain
	// Never shows no progress.
	Never
)

var modeNames = []string{"auto", "always", "plain", "never"}

// String returns the mode's name as --progress takes it.
func (m Mode) String() string {
	if m < 0 || int(m) >= len(modeNames) {
		return fmt.Sprintf("Mode(%d)", int(m))
	}
	return modeNames[m]
}

// DefaultEvery is the least time between two plain lines of one stage.
const DefaultEvery = 5 * time.Second

// Flags are the --progress and --quiet flags every long-running command
// takes (Register); New makes the command's Display from them.
type Flags struct {
	// Mode is --progress's mode; --quiet sets Never.
	Mode Mode
	// Every is the least time between a stage's plain lines (0:
	// DefaultEvery). --progress takes a duration for it, as tandem bench's
	// --progress did before the modes: a positive one sets Every (mode
	// auto), 0 means never.
	Every time.Duration
	// Delay hides the stages that end sooner (a quick load of a small
	// model shows nothing); the command sets it, not a flag.
	Delay time.Duration
}

// Register defines --progress and --quiet on fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.Var((*modeFlag)(f), "progress", "`mode` of the progress on stderr: auto (a line redrawn in place on a terminal, plain lines every few seconds otherwise), always (redrawn in place even off a terminal), plain, or never; a duration sets the period of the plain lines (0: never)")
	fs.BoolFunc("quiet", "show no progress on stderr (--progress=never)", func(s string) error {
		if s == "true" {
			f.Mode = Never
		}
		return nil
	})
}

// ParseMode reads a --progress value: a mode's name, or a duration (the
// period of the plain lines; 0 is Never).
func ParseMode(s string) (Mode, time.Duration, error) {
	for i, n := range modeNames {
		if strings.EqualFold(s, n) {
			return Mode(i), 0, nil
		}
	}
	if s == "0" {
		return Never, 0, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		if d == 0 {
			return Never, 0, nil
		}
		return Auto, d, nil
	}
	return 0, 0, fmt.Errorf("progress %q: want auto, always, plain or never (or a period such as 10s)", s)
}

// modeFlag is Flags as the --progress flag.Value.
type modeFlag Flags

func (m *modeFlag) String() string {
	if m == nil {
		return Auto.String()
	}
	return m.Mode.String()
}

func (m *modeFlag) Set(s string) error {
	mode, every, err := ParseMode(s)
	if err != nil {
		return err
	}
	m.Mode = mode
	if every > 0 {
		m.Every = every
	}
	return nil
}

// New makes the Display the flags ask for on f (the command's stderr): the
// mode resolved against f (a terminal?) and the environment (TERM=dumb: no
// redrawing; NO_COLOR: no colour).
func (f Flags) New(file *os.File) *Display {
	o := f.options(IsTerminal(file), os.Getenv)
	o.Width = func() int { return termWidth(file) }
	return NewWriter(file, o)
}

// options resolves the flags to a Display's options, given whether stderr
// is a terminal and the environment.
func (f Flags) options(terminal bool, getenv func(string) string) Options {
	dumb := getenv("TERM") == "dumb"
	o := Options{Every: f.Every, Delay: f.Delay}
	switch f.Mode {
	case Never:
		o.Off = true
	case Always:
		o.Terminal = true
	case Auto:
		o.Terminal = terminal && !dumb
	}
	o.Color = o.Terminal && !dumb && getenv("NO_COLOR") == ""
	return o
}
