package sim

import (
	"fmt"
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

// quadraticProfile is a profile whose prefill rows follow α + βn + γn²
// exactly (a per-step cost, the weights, attention from position 0), at 1,
// 16 and every 256 tokens up to 4096.
func quadraticProfile(t *testing.T, alpha, beta, gamma float64) *Profile {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"version":1,"decode":[{"batch":1,"context":16,"seconds":0.01}],"prefill":[`)
	for i, n := range append([]int{1, 16}, 256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096) {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"tokens":%d,"seconds":%g}`, n, alpha+beta*float64(n)+gamma*float64(n*n))
	}
	b.WriteString(`]}`)
	p, err := ParseProfile([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// chunked is the steps of one n-token prompt prefilled alone in chunks of
// at most c tokens.
func chunked(n, c int) []Batch {
	var steps []Batch
	for pos := 0; pos < n; pos += c {
		l := min(c, n-pos)
		steps = append(steps, Batch{PrefillTokens: l, Chunks: []Chunk{{Pos: pos, Len: l}}})
	}
	return steps
}

func TestProfileCostsAChunkByItsPosition(t *testing.T) {
	const alpha, beta, gamma = 0.005, 2e-4, 1e-7
	smooth := quadraticProfile(t, alpha, beta, gamma)
	profiles := []struct {
		name string
		p    *Profile
	}{{"the built-in profile", DefaultProfile()}, {"a smooth profile", smooth}}

	t.Run("a chunk from position 0 costs what it did", func(t *testing.T) {
		for _, pr := range profiles {
			for _, pt := range pr.p.Prefill {
				if pt.Tokens < 2 {
					continue
				}
				alone := Batch{PrefillTokens: pt.Tokens}
				at0 := Batch{PrefillTokens: pt.Tokens, Chunks: []Chunk{{Pos: 0, Len: pt.Tokens}}}
				if a, b := pr.p.StepTime(alone), pr.p.StepTime(at0); a != b || relErr(b, pt.Seconds) > gridTolerance {
					t.Errorf("%s, %d tokens: %v with the chunk at 0, %v without, measured %.6fs", pr.name, pt.Tokens, b, a, pt.Seconds)
				}
				mixed := Batch{PrefillTokens: pt.Tokens, Decodes: 3, DecodeContext: 600}
				mixed0 := mixed
				mixed0.Chunks = []Chunk{{Pos: 0, Len: pt.Tokens}}
				if a, b := pr.p.StepTime(mixed), pr.p.StepTime(mixed0); a != b {
					t.Errorf("%s, %d tokens beside decodes: %v with the chunk at 0, %v without", pr.name, pt.Tokens, b, a)
				}
			}
		}
	})

	t.Run("a prompt in chunks costs at least the one-shot prefill", func(t *testing.T) {
		for _, pr := range profiles {
			for _, n := range []int{600, 1024, 1475, 2048, 3000, 4096} {
				oneShot := pr.p.StepTime(Batch{PrefillTokens: n, Chunks: []Chunk{{Pos: 0, Len: n}}})
				for _, c := range []int{64, 256, 512, 1000, 2048} {
					if c >= n {
						continue
					}
					steps := chunked(n, c)
					var sum time.Duration
					for _, b := range steps {
						sum += pr.p.StepTime(b)
					}
					if sum < oneShot {
						t.Errorf("%s: %d tokens in chunks of %d cost %v, less than in one step (%v)", pr.name, n, c, sum, oneShot)
					}
					// On a smooth curve exactly one per-step cost α more per
					// extra step (within the rounding of each step to 1 ns).
					if pr.p == smooth {
						want := oneShot.Seconds() + float64(len(steps)-1)*smooth.PrefillSeconds(0)
						if math.Abs(sum.Seconds()-want) > 1e-8*float64(len(steps)) {
							t.Errorf("%s: %d tokens in chunks of %d cost %v, want the one-shot %v plus %d·P(0) = %.6fs", pr.name, n, c, sum, oneShot, len(steps)-1, want)
						}
					}
				}
			}
		}
	})

	t.Run("the extra is the attention over the earlier context", func(t *testing.T) {
		// P(0) extrapolates the first segment: α − 16γ here.
		for _, c := range []Chunk{{Pos: 1024, Len: 512}, {Pos: 512, Len: 1024}, {Pos: 2048, Len: 2048}} {
			want := 2*gamma*float64(c.Pos*c.Len) - 16*gamma
			if got := smooth.LaterChunkSeconds(c); math.Abs(got-want) > 1e-9 {
				t.Errorf("%+v: %.9fs, want 2γ·p·c = %.9fs", c, got, want)
			}
			alone := smooth.StepTime(Batch{PrefillTokens: c.Len, Chunks: []Chunk{c}})
			at0 := smooth.StepTime(Batch{PrefillTokens: c.Len})
			if d := alone - at0; math.Abs(d.Seconds()-want) > 1e-8 {
				t.Errorf("%+v: step %v against %v from position 0, want %.6fs more", c, alone, at0, want)
			}
			b := Batch{PrefillTokens: c.Len + 100, Chunks: []Chunk{c, {Pos: 0, Len: 100}}, Decodes: 2, DecodeContext: 40}
			plain := b
			plain.Chunks = nil
			if d := smooth.StepTime(b) - smooth.StepTime(plain); math.Abs(d.Seconds()-want) > 1e-8 {
				t.Errorf("%+v beside a new prompt and decodes: %v more than from position 0, want %.6fs", c, d, want)
			}
		}
	})

	t.Run("a later chunk never costs less than from position 0", func(t *testing.T) {
		p := DefaultProfile()
		for _, pos := range []int{16, 512, 1024, 1500, 3000} {
			for _, l := range []int{2, 64, 512, 1024} {
				if d := p.LaterChunkSeconds(Chunk{Pos: pos, Len: l}); d < 0 {
					t.Errorf("%d tokens at %d: %v", l, pos, d)
				}
			}
		}
	})
}
