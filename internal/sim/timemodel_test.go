package sim

import (
	"math"
	"strings"
	"testing"
	"time"
)

// The time model replays a profile: at every point of the profile's own
// grid it gives the measured step time (within 0.1%, the rounding of a
// Duration), and between points it interpolates. These are unit tests of
// the model against the committed profile, not timed tests.
const gridTolerance = 0.001

func relErr(got time.Duration, want float64) float64 {
	return math.Abs(got.Seconds()-want) / want
}

func TestProfileReplaysItsGrid(t *testing.T) {
	p := DefaultProfile()
	for _, pt := range p.Prefill {
		if pt.Tokens < 2 {
			continue // one token is a decode-shaped step (BatchOf)
		}
		if got := p.StepTime(Batch{PrefillTokens: pt.Tokens}); relErr(got, pt.Seconds) > gridTolerance {
			t.Errorf("prefill %d tokens: model %v, measured %.6fs", pt.Tokens, got, pt.Seconds)
		}
	}
	for _, pt := range p.Decode {
		got := p.StepTime(Batch{Decodes: pt.Batch, DecodeContext: pt.Batch * pt.Context})
		if relErr(got, pt.Seconds) > gridTolerance {
			t.Errorf("decode batch %d context %d: model %v, measured %.6fs", pt.Batch, pt.Context, got, pt.Seconds)
		}
	}
}

// Leaving a point out and predicting it from its neighbours says how good
// interpolation is between grid points (with the grid twice as coarse
// there): within a factor of 2.5 either way on the built-in profile, which
// was measured on a 2-core VM shared with other work — its decode points
// at batch 8–16 and context 512 stand out from their neighbours by about
// that much.
func TestProfileInterpolatesBetweenGridPoints(t *testing.T) {
	p := DefaultProfile()
	for i := 1; i+1 < len(p.prefillX); i++ {
		q := *p
		q.prefillX = append(append([]float64(nil), p.prefillX[:i]...), p.prefillX[i+1:]...)
		q.prefillY = append(append([]float64(nil), p.prefillY[:i]...), p.prefillY[i+1:]...)
		got := q.PrefillSeconds(int(p.prefillX[i]))
		if ratio := got / p.prefillY[i]; ratio > 2.5 || ratio < 0.4 {
			t.Errorf("prefill %v tokens left out: predicted %.4fs, measured %.4fs", p.prefillX[i], got, p.prefillY[i])
		}
	}
	for ri, r := range p.rows {
		for i := 1; i+1 < len(r.ctx); i++ {
			got := interp(append(append([]float64(nil), r.ctx[:i]...), r.ctx[i+1:]...), append(append([]float64(nil), r.secs[:i]...), r.secs[i+1:]...), r.ctx[i])
			if ratio := got / r.secs[i]; ratio > 2.5 || ratio < 0.4 {
				t.Errorf("decode batch %d context %v left out (row %d): predicted %.4fs, measured %.4fs", r.batch, r.ctx[i], ri, got, r.secs[i])
			}
		}
	}
}

func TestProfileMixedStepsAndExtrapolation(t *testing.T) {
	p, err := ParseProfile([]byte(`{"version":1,
		"prefill":[{"tokens":10,"seconds":0.1},{"tokens":20,"seconds":0.2}],
		"decode":[{"batch":1,"context":10,"seconds":0.01},{"batch":1,"context":20,"seconds":0.02},
		          {"batch":4,"context":10,"seconds":0.04},{"batch":4,"context":20,"seconds":0.06}]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		b    Batch
		want float64
	}{
		{"a prompt between two points", Batch{PrefillTokens: 15}, 0.15},
		{"a prompt beyond the grid follows the last segment", Batch{PrefillTokens: 40}, 0.4},
		{"a tiny prompt stays above a tenth of the smallest point", Batch{PrefillTokens: 2}, 0.02},
		{"decodes between batch sizes and contexts", Batch{Decodes: 2, DecodeContext: 30}, 0.015 + (0.05-0.015)/3},
		{"a mixed step: all tokens through the prefill curve plus the decodes' extra attention", Batch{PrefillTokens: 16, Decodes: 4, DecodeContext: 80}, 0.2 + 0.02},
		{"an empty step is free", Batch{}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := p.StepTime(c.b); math.Abs(got.Seconds()-c.want) > 1e-6 {
				t.Errorf("%+v: %v, want %.6fs", c.b, got, c.want)
			}
		})
	}
}

func TestParseProfileRefusesBadProfiles(t *testing.T) {
	for _, c := range []struct{ name, json, want string }{
		{"another version", `{"version":2,"prefill":[{"tokens":1,"seconds":1}],"decode":[{"batch":1,"context":1,"seconds":1}]}`, "version 2"},
		{"no decode points", `{"version":1,"prefill":[{"tokens":1,"seconds":1}]}`, "needs prefill and decode"},
		{"a zero time", `{"version":1,"prefill":[{"tokens":1,"seconds":0}],"decode":[{"batch":1,"context":1,"seconds":1}]}`, "positive time"},
		{"a point twice", `{"version":1,"prefill":[{"tokens":1,"seconds":1},{"tokens":1,"seconds":2}],"decode":[{"batch":1,"context":1,"seconds":1}]}`, "twice"},
		{"an unknown field", `{"version":1,"prefil":[]}`, "unknown field"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := ParseProfile([]byte(c.json)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one mentioning %q", err, c.want)
			}
		})
	}
}

func TestKnobs(t *testing.T) {
	k := Knobs{TTFT: 100 * time.Millisecond, ITL: 20 * time.Millisecond, PrefillPerToken: time.Millisecond}
	for _, c := range []struct {
		b    Batch
		want time.Duration
	}{
		{Batch{PrefillTokens: 50}, 150 * time.Millisecond},
		{Batch{Decodes: 8, DecodeContext: 800}, 20 * time.Millisecond},
		{Batch{PrefillTokens: 10, Decodes: 1, DecodeContext: 5}, 130 * time.Millisecond},
	} {
		if got := k.StepTime(c.b); got != c.want {
			t.Errorf("%+v: %v, want %v", c.b, got, c.want)
		}
	}
}
