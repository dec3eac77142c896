package tensor

import (
	"fmt"
	"time"
)

// Summary is the calibration in one line for the log: the choice, its
// source and reason, and the times behind it.
func (c Calibration) Summary() string {
	s := fmt.Sprintf("kernels %s, quantized %s (%s: %s)", c.Set, c.QuantText(), c.Source, c.Reason)
	for _, t := range c.SetTimes {
		s += fmt.Sprintf("; %s %s", t.Name, timesText(c.SetWorkloads, t.Times))
	}
	for _, t := range c.QuantTimes {
		s += fmt.Sprintf("; quantized %s %s", t.Name, timesText(c.QuantWorkloads, t.Times))
	}
	return s
}

// QuantText names the quantized kernels chosen: Quant, followed by
// QuantDecode where decode's single rows run others ("avx512vnni, avx2 for
// decode", "avx512vnni, avx2,q6_k=avx512vnni for decode").
func (c Calibration) QuantText() string {
	if c.QuantDecode == "" || c.QuantDecode == c.Quant {
		return c.Quant
	}
	return c.Quant + ", " + c.QuantDecode + " for decode"
}

// timesText lists a candidate's times per workload.
func timesText(ws []Workload, ts []time.Duration) string {
	s := ""
	for i, d := range ts {
		if i > 0 {
			s += ", "
		}
		name := "?"
		if i < len(ws) {
			name = ws[i].Name
		}
		s += fmt.Sprintf("%s %v", name, d.Round(time.Microsecond))
	}
	return s
}

// FormatHint compares, from the measurements, the chosen set's bf16
// prefill arithmetic rate with the chosen quantized kernels' Q8_0 rate and
// returns a sentence for the user when Q8_0 is at least hintRatio times
// faster (a GGUF Q8_0 model would prefill that much faster on this CPU);
// "" otherwise or without measurements.
func (c Calibration) FormatHint() string {
	bf16 := c.rate(c.SetWorkloads, c.SetTimes, c.Set, "bf16 prefill")
	q8 := c.rate(c.QuantWorkloads, c.QuantTimes, c.Quant, "q8_0 prefill")
	if bf16 <= 0 || q8 < hintRatio*bf16 {
		return ""
	}
	return fmt.Sprintf("bf16 prefill products on this CPU run at %.0f GFLOP/s per thread, Q8_0 at %.0f GFLOP/s (%.1fx): a Q8_0 GGUF of the model (tandem model quantize) prefills about that much faster",
		bf16/1e9, q8/1e9, q8/bf16)
}

// hintRatio is how much faster Q8_0 must be for FormatHint to speak.
const hintRatio = 2.0

// rate is candidate cand's FLOP rate on the workload named name; 0 if it
// was not measured.
func (c Calibration) rate(ws []Workload, ts []Timing, cand, name string) float64 {
	for _, t := range ts {
		if t.Name != cand {
			continue
		}
		for i, w := range ws {
			if w.Name == name && i < len(t.Times) && t.Times[i] > 0 {
				return w.FLOPs() / t.Times[i].Seconds()
			}
		}
	}
	return 0
}
