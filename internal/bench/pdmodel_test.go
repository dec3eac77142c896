package bench

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/bench/workload"
)

func TestPrefillBusyByHand(t *testing.T) {
	same := func(n int, s float64) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	tests := []struct {
		name                  string
		services              []float64
		s, cv2, overhead, slo float64
		q                     float64
		want, tooLong         float64
	}{
		// M/D/1, s = 1 s: 0.5·exp(−t·0.5/0.5) = 0.1 at t = ln 5.
		{"half busy when the slack is ln 5 service times", same(4, 1), 1, 0, 0, 1 + math.Log(5), 0.9, 0.5, 0},
		// c = 1 (exponential service) doubles the slack needed: t = 2 ln 5.
		{"exponential service needs twice the slack", same(4, 1), 1, 1, 0, 1 + 2*math.Log(5), 0.9, 0.5, 0},
		// The overhead eats slack: s = 2, o = 1, t = 2·ln 5 for c = 1/2.
		{"the overhead comes off the slack", same(4, 2), 2, 0, 1, 3 + 2*math.Log(5), 0.9, 0.5, 0},
		{"an SLO a lone prefill cannot meet", same(4, 1), 1, 0, 0.5, 1.5, 0.9, 0, 1},
		// One prompt in ten (service 9 s) cannot meet a 3 s SLO: with q = 0.9
		// the other nine must all meet it, which only an idle engine does.
		{"a tenth of the prompts too long for a goal of 0.9", append(same(9, 1), 9), 1, 0, 0, 3, 0.9, 0, 0.1},
		// With q = 0.8 the nine short ones (slack 2 s) may miss 1/9 of the
		// time in all: ρ·exp(−2(1−ρ)/0.5)) = (0.9−0.8)/0.9 → solved below.
		{"a tenth too long leaves the rest less room", append(same(9, 1), 9), 1, 0, 0, 3, 0.8, rhoFor(2, 0.5, 1.0/9), 0.1},
	}
	t.Run("round-robin over four engines: gaps with SCV 1/4 need a quarter of Poisson's slack", func(t *testing.T) {
		// c = (1/4 + 0)/2 = 1/8: 0.5·exp(−t·0.5/(1/8)) = 0.1 at t = ln 5 / 4.
		got, _ := prefillBusy(same(4, 1), 1, 0.25, 0, 0, 1+math.Log(5)/4, 0.9)
		if math.Abs(got-0.5) > 1e-9 {
			t.Errorf("prefillBusy = %v, want 0.5", got)
		}
	})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, tooLong := prefillBusy(tc.services, tc.s, 1, tc.cv2, tc.overhead, tc.slo, tc.q)
			if math.Abs(got-tc.want) > 1e-9 || math.Abs(tooLong-tc.tooLong) > 1e-12 {
				t.Errorf("prefillBusy = %v (too long %v), want %v (%v)", got, tooLong, tc.want, tc.tooLong)
			}
		})
	}
}

// solveDown finds where a decreasing f crosses q in [0, 1] by bisection.
func solveDown(f func(float64) float64, q float64) float64 {
	lo, hi := 0.0, 1.0
	for range 200 {
		mid := (lo + hi) / 2
		if f(mid) >= q {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// rhoFor solves ρ·exp(−t(1−ρ)/cs) = miss for ρ by bisection, independently
// of prefillBusy.
func rhoFor(t, cs, miss float64) float64 {
	lo, hi := 0.0, 1.0
	for range 200 {
		mid := (lo + hi) / 2
		if mid*math.Exp(-t*(1-mid)/cs) <= miss {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// pdRecords is a hand-made pd run: round 0 has three requests far apart
// (each prefill leg alone, each decoding alone: k = 1), round 1 two at once
// (k = 2), round 2 four at once (k = 4). Prefill legs take 10 + 0.5·L ms,
// every TTFT has 40 ms more, and TPOT is 10 + 10·k ms over 10 decode steps.
func pdRecords() []Record {
	ms := time.Millisecond
	var recs []Record
	for i, l := range []int{100, 200, 300} {
		leg := 10 + l/2
		ttft := time.Duration(leg+40) * ms
		recs = append(recs, Record{Round: 0, Start: time.Duration(i) * 10 * time.Second, PromptTokens: l, OutputTokens: 11,
			TTFT: ttft, E2E: ttft + 10*20*ms, Timing: map[string]float64{"proxy": 0, "prefill_leg": float64(leg)}})
	}
	for _, lv := range []struct{ round, n, tpot int }{{1, 2, 30}, {2, 4, 50}} {
		for range lv.n {
			recs = append(recs, Record{Round: lv.round, PromptTokens: 200, OutputTokens: 11,
				TTFT: 150 * ms, E2E: 150*ms + time.Duration(10*lv.tpot)*ms, Timing: map[string]float64{"proxy": 0, "prefill_leg": 110}})
		}
	}
	return recs
}

func TestModelPDByHand(t *testing.T) {
	// s̄ = s(200) = 110 ms; the nine prompts (100, 300 and seven of 200
	// — mean 200) have Var(L) = 20000/9, so C² = 0.5²·Var(L)/110².
	const sbar, o = 0.110, 0.040
	cv2 := 0.25 * (20000.0 / 9) / (110 * 110)
	// With goal 0.81, q = 0.9; choose the TTFT SLO at which ρ* = 1/2:
	// 0.5·exp(−t·0.5/(c·s̄)) = 0.1 ⇔ t = 2·c·s̄·ln 5.
	c := (1 + cv2) / 2
	slo := SLO{TTFT: time.Duration((sbar + o + 2*c*sbar*math.Log(5)) * float64(time.Second)), TPOT: 100 * time.Millisecond}
	s := &Suite{
		Plan:    &Plan{SLO: slo, Goal: 0.81, Workload: &workload.Workload{Name: "long"}},
		Results: []*Result{{Target: "pd", Load: Load{Rate: 1}, Records: pdRecords()}, {Target: "colocated", Load: Load{Rate: 1}, Records: []Record{{TTFT: time.Second}}}},
	}
	m := ModelPD(s, "pd", 64)
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-6*max(1, math.Abs(want)) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if m.PrefillSource != "alone" || m.PrefillSamples != 3 || m.DecodeFit != "fit" || m.DecodeSamples != 9 || m.Unattainable != "" {
		t.Fatalf("model %+v", m)
	}
	near("mean prompt", m.MeanPrompt, 200)
	near("mean output", m.MeanOutput, 11)
	near("A", m.PrefillA, 10)
	near("B", m.PrefillB, 0.5)
	near("s̄", m.PrefillSeconds, sbar)
	near("C²", m.PrefillCV2, cv2)
	near("overhead", m.Overhead, o)
	// The slack of each prompt is T0 = 2c·s̄·ln 5 plus s̄ − s(L): +50 ms
	// for the 100-token prompt, −50 ms for the 300-token one, T0 for the
	// seven of 200. (With every prompt at s̄, ρ* would be exactly 0.5.)
	t0, cs := 2*c*sbar*math.Log(5), c*sbar
	rho := solveDown(func(r float64) float64 {
		miss := func(t float64) float64 { return r * math.Exp(-t*(1-r)/cs) }
		return 1 - (miss(t0+0.05)+miss(t0-0.05)+7*miss(t0))/9
	}, 0.9)
	if rho < 0.45 || rho > 0.5 {
		t.Errorf("the hand-solved ρ* = %v: expected a little under 0.5 (the spread costs some room)", rho)
	}
	near("ρ*", m.PrefillBusy, rho)
	near("prefill rate", m.PrefillRate, rho/sbar)
	near("prompts too long", m.PrefillTooLong, 0)
	// TPOT = 10 + 10·k exactly (σ = 0): k* = (100 − 10)/10 = 9, at TPOT
	// 100 ms; 9 sequences of 10 decode steps of 0.1 s: 9 req/s.
	near("step A", m.StepA, 10)
	near("step B", m.StepB, 10)
	near("σ", m.StepSigma, 0)
	near("observed batch", m.ObservedBatch, 4)
	near("k*", m.DecodeBatch, 9)
	near("decode rate", m.DecodeRate, 9)
	if !m.Extrapolated {
		t.Error("k* = 9 from batches of at most 4 is not flagged as extrapolated")
	}
	// One of P prefill engines behind round-robin sees Erlang-P gaps
	// (SCV 1/P): the same slack equation with c = (1/P + C²)/2.
	rateAt := func(p int) float64 {
		cp := (1/float64(p) + cv2) / 2 * sbar
		return solveDown(func(r float64) float64 {
			miss := func(t float64) float64 { return r * math.Exp(-t*(1-r)/cp) }
			return 1 - (miss(t0+0.05)+miss(t0-0.05)+7*miss(t0))/9
		}, 0.9) / sbar
	}
	near("prefill rate at P=1", m.PrefillRateAt(1), rho/sbar)
	near("prefill rate at P=4", m.PrefillRateAt(4), rateAt(4))
	near("prefill rate at P=16", m.PrefillRates[16], rateAt(16))
	if !(rateAt(2) > rho/sbar && rateAt(4) > rateAt(2)) {
		t.Errorf("more regular arrivals should allow more per engine: P=1 %v, 2 %v, 4 %v", rho/sbar, rateAt(2), rateAt(4))
	}
	// N = 2: 1P:1D, min(ρ*/s̄ ≈ 4.5, 9). N = 4: 2P:2D, min(2·rate(2) ≈ 12.4,
	// 18) beats 3P:1D's 9. N = 8: 4P:4D, min(4·rate(4) ≈ 29.5, 36) beats
	// 5P:3D's 27 (the decode side caps it).
	want := []Split{{2, 1, 1, rho / sbar}, {4, 2, 2, 2 * rateAt(2)}, {8, 4, 4, 4 * rateAt(4)}}
	for i, w := range want {
		if g := m.BestSplits[i]; g.N != w.N || g.P != w.P || g.D != w.D || math.Abs(g.Goodput-w.Goodput) > 1e-6 {
			t.Errorf("split %d: %+v, want %+v", i, g, w)
		}
	}
	var out strings.Builder
	WritePDModelHeader(&out)
	m.Write(&out, slo)
	for _, want := range []string{"ran alone", "s(L) = 10.0 + 0.500·L ms", fmt.Sprintf("ρ* = %.2f", rho), "TPOT = 10.0 + 10.00·k ms", "k* = 9.0", "extrapolated", fmt.Sprintf("N=4 2P:2D %.2f req/s", 2*rateAt(2)), "per engine of P behind round-robin: P=2", "Little's law"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

func TestModelPDFallbacks(t *testing.T) {
	ms := time.Millisecond
	t.Run("without Server-Timing the quietest TTFT median is the service time, and one batch size gives a lower bound", func(t *testing.T) {
		var recs []Record
		for i := range 3 {
			recs = append(recs, Record{Start: time.Duration(i) * 10 * time.Second, PromptTokens: 100, OutputTokens: 11, TTFT: 200 * ms, E2E: 200*ms + 10*20*ms})
		}
		quiet := &Result{Target: "pd", Load: Load{Rate: 0.1}, Records: recs, Report: &Report{Completed: 3, RequestThroughput: 0.1, TTFT: Summary{P50: 200}}}
		busy := &Result{Target: "pd", Load: Load{Rate: 1}, Records: recs, Report: &Report{Completed: 3, RequestThroughput: 0.9, TTFT: Summary{P50: 900}}}
		s := &Suite{Plan: &Plan{SLO: SLO{TTFT: 2 * time.Second, TPOT: 50 * ms}}, Results: []*Result{busy, quiet}}
		m := ModelPD(s, "pd", 64)
		if m.PrefillSource != "lowest TTFT p50" || math.Abs(m.PrefillSeconds-0.2) > 1e-9 || m.Overhead != 0 || m.PrefillCV2 != 0 {
			t.Errorf("prefill %+v", m)
		}
		// Every request decoded alone (k = 1): no line; the best level that
		// met TPOT ≤ 50 ms (all of them, at 20 ms) is the 0.9 req/s one.
		if m.DecodeFit != "lower bound" || m.DecodeRate != 0.9 || m.ObservedBatch != 1 {
			t.Errorf("decode %+v", m)
		}
	})
	t.Run("a TPOT SLO below the one-sequence step time is unattainable", func(t *testing.T) {
		s := &Suite{Plan: &Plan{SLO: SLO{TTFT: 10 * time.Second, TPOT: 5 * ms}}, Results: []*Result{{Target: "pd", Records: pdRecords()}}}
		if m := ModelPD(s, "pd", 64); m.DecodeRate != 0 || !strings.Contains(m.Unattainable, "TPOT") || len(m.BestSplits) != 0 {
			t.Errorf("model %+v", m)
		}
	})
	t.Run("max-num-seqs caps the batch", func(t *testing.T) {
		s := &Suite{Plan: &Plan{SLO: SLO{TTFT: 10 * time.Second, TPOT: 100 * ms}}, Results: []*Result{{Target: "pd", Records: pdRecords()}}}
		// k* would be 9; capped at 6: TPOT 70 ms, 6/(10·0.07) req/s.
		if m := ModelPD(s, "pd", 6); m.DecodeBatch != 6 || math.Abs(m.DecodeRate-6/0.7) > 1e-9 {
			t.Errorf("model %+v", m)
		}
	})
	t.Run("no requests of the target", func(t *testing.T) {
		s := &Suite{Plan: &Plan{}, Results: []*Result{{Target: "colocated", Records: pdRecords()}}}
		if m := ModelPD(s, "pd", 64); m.Unattainable == "" {
			t.Errorf("model %+v", m)
		}
	})
}

func TestModelPDPromptsTooLongForTheSLO(t *testing.T) {
	// s(300) + o = 0.16 + 0.04 = 0.2 s: a 190 ms TTFT SLO is out of reach
	// for the one 300-token prompt in nine, more than the 1 − q = 10% a
	// goal of 0.81 lets miss, so no P:D ratio meets it.
	s := &Suite{
		Plan:    &Plan{SLO: SLO{TTFT: 190 * time.Millisecond, TPOT: 100 * time.Millisecond}, Goal: 0.81, Workload: &workload.Workload{Name: "long"}},
		Results: []*Result{{Target: "pd", Load: Load{Rate: 1}, Records: pdRecords()}},
	}
	m := ModelPD(s, "pd", 64)
	if m.PrefillRate != 0 || math.Abs(m.PrefillTooLong-1.0/9) > 1e-12 || !strings.Contains(m.Unattainable, "11% of the prompts take longer than the TTFT SLO") || len(m.BestSplits) != 0 {
		t.Errorf("model %+v", m)
	}
	var out strings.Builder
	m.Write(&out, s.Plan.SLO)
	if !strings.Contains(out.String(), "(11% of the prompts miss it alone)") || !strings.Contains(out.String(), "no P:D ratio meets the SLO") {
		t.Errorf("report:\n%s", out.String())
	}
}
