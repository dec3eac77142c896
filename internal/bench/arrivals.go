package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// GammaArrivals returns the start offsets of n requests whose gaps follow a
// gamma distribution with mean 1/rate and shape burstiness, as vLLM's
// benchmark does: burstiness 1 is a Poisson process, below 1 the arrivals
// come in bursts (gaps with a coefficient of variation of
// 1/sqrt(burstiness)), above 1 they are more even. A pure function of seed;
// the first request starts at 0.
func GammaArrivals(seed uint64, n int, rate, burstiness float64) []time.Duration {
	if burstiness == 1 {
		return Arrivals(seed, n, rate)
	}
	r := rand.New(rand.NewPCG(seed, 0x67616d6d61)) // "gamma"
	out := make([]time.Duration, n)
	var t float64
	scale := 1 / (rate * burstiness)
	for i := range out {
		out[i] = time.Duration(t * float64(time.Second))
		t += gammaDraw(r, burstiness) * scale
	}
	return out
}

// gammaDraw draws from Gamma(shape, 1) by Marsaglia and Tsang's method,
// boosted for shape < 1.
func gammaDraw(r *rand.Rand, shape float64) float64 {
	if shape < 1 {
		u := r.Float64()
		for u == 0 {
			u = r.Float64()
		}
		return gammaDraw(r, shape+1) * math.Pow(u, 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := r.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := r.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}

// Load is how requests arrive at one level of a run.
type Load struct {
	// Rate is the mean arrival rate in requests (conversations) per
	// second; 0 means a closed loop of Concurrency.
	Rate float64 `json:"rate,omitempty"`
	// Burstiness is the gamma shape of the gaps (1: Poisson). Default 1.
	Burstiness float64 `json:"burstiness,omitempty"`
	// Concurrency is the closed loop's width, or with a Rate a cap on the
	// requests in flight (0: none).
	Concurrency int `json:"concurrency,omitempty"`
}

// String names the load in tables: "rate 2", "rate 2 (gamma 0.5)",
// "conc 4".
func (l Load) String() string {
	switch {
	case l.Rate == 0:
		return fmt.Sprintf("conc %d", l.Concurrency)
	case l.Burstiness != 0 && l.Burstiness != 1:
		return fmt.Sprintf("rate %g (gamma %g)", l.Rate, l.Burstiness)
	}
	return fmt.Sprintf("rate %g", l.Rate)
}

// schedule returns the arrival offsets of n conversations, or nil for a
// closed loop.
func (l Load) schedule(seed uint64, n int) []time.Duration {
	if l.Rate <= 0 {
		return nil
	}
	return GammaArrivals(seed, n, l.Rate, cmpOr(l.Burstiness, 1))
}

func cmpOr(x, def float64) float64 {
	if x == 0 {
		return def
	}
	return x
}
