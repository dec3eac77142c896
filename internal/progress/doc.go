// Package progress shows how far a long command has come on stderr, the way
// users expect of a CLI: on a terminal, one line redrawn in place (carriage
// return and erase-to-end, written in one piece so it does not flicker) with
// a bar, the counts, the rate and an ETA, the final line left on screen;
// elsewhere (CI, pipes, log files), plain lines, at most one per stage every
// few seconds and one when the stage ends. Results on stdout are never
// touched, so a JSON report stays parseable.
//
// A Display is made once per command from its --progress and --quiet flags
// (Flags); the work then opens a Stage per phase (Display.Start), calls
// Stage.Add from any number of goroutines and Stage.Done at the end. The
// rate and ETA come from a moving window of samples, so a phase that slows
// down shows it. Other stderr output goes through Display.Writer, which
// lifts the progress line off the screen first.
//
// The package is the standard library only. The lower layers (the model
// loader, the checkpoint writer, the benchmark runners) take plain callbacks
// or a *Display that may be nil, so a library call without a Display shows
// nothing.
package progress
