package planner

import "math"

// PrefillBusy is the utilisation ρ of a GI/G/1 prefill engine (service
// mean s seconds, squared coefficient of variation cv2; arrivals with
// squared coefficient of variation ca2, 1 for Poisson, 1/P for one of P
// engines behind round-robin dispatch) at which a mean of q of the
// requests, whose own service times are services, wait at most slo − their
// service − overhead, under the exponential-tail approximation
// P(W > t) ≈ ρ·exp(−t(1−ρ)/(c·s)), c = (ca2+cv2)/2 (Kingman; under FCFS
// the wait does not depend on the request's own service). tooLong is the
// fraction of requests with no slack at all; ρ is 0 when even an idle
// engine misses the goal. This is the prefill half of the model `tandem
// bench report` fits (internal/bench, PDModel).
func PrefillBusy(services []float64, s, ca2, cv2, overhead, slo, q float64) (rho, tooLong float64) {
	if len(services) == 0 {
		return 0, 0
	}
	slack := make([]float64, 0, len(services))
	for _, sv := range services {
		if t := slo - sv - overhead; t > 0 {
			slack = append(slack, t)
		}
	}
	n := float64(len(services))
	tooLong = 1 - float64(len(slack))/n
	c := (ca2 + cv2) / 2
	met := func(rho float64) float64 { // mean P(W ≤ slack), the too-long prompts counting 0
		var total float64
		for _, t := range slack {
			total += 1 - rho*math.Exp(-t*(1-rho)/(c*s))
		}
		return total / n
	}
	if met(0) < q {
		return 0, tooLong
	}
	lo, hi := 0.0, 1.0 // met falls as ρ grows
	for range 100 {
		mid := (lo + hi) / 2
		if met(mid) >= q {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, tooLong
}

// FitLine is the least-squares line y = a + b·x and its residual standard
// deviation (n−2 degrees of freedom, 0 for two points); ok when the xs
// differ.
func FitLine(xs, ys []float64) (a, b, sigma float64, ok bool) {
	n := float64(len(xs))
	mx, my := Mean(xs), Mean(ys)
	var sxx, sxy float64
	for i := range xs {
		sxx += (xs[i] - mx) * (xs[i] - mx)
		sxy += (xs[i] - mx) * (ys[i] - my)
	}
	if len(xs) < 2 || sxx <= 1e-12*max(1, mx*mx)*n {
		return 0, 0, 0, false
	}
	b = sxy / sxx
	a = my - b*mx
	if len(xs) > 2 {
		var ss float64
		for i := range xs {
			r := ys[i] - a - b*xs[i]
			ss += r * r
		}
		sigma = math.Sqrt(ss / (n - 2))
	}
	return a, b, sigma, true
}

// DecodeBatchAtSLO is the batch k* a decode engine whose step time is
// a + b·k ms (residual σ ms) may carry so that q of its TPOTs stay under
// slo ms: (slo − a − z·σ)/b with z the normal q-quantile, at most maxSeqs.
// It is 0 when no batch meets the SLO.
func DecodeBatchAtSLO(a, b, sigma, slo, q float64, maxSeqs int) float64 {
	if slo <= 0 || b <= 0 {
		return float64(maxSeqs)
	}
	z := math.Sqrt2 * math.Erfinv(2*q-1)
	return max(0, min((slo-a-z*sigma)/b, float64(maxSeqs)))
}

// DecodeRate is the requests/s a decode engine carrying a batch of k at
// step time tpot seconds serves when each request decodes meanOutput − 1
// tokens after its first (Little's law).
func DecodeRate(k, tpot, meanOutput float64) float64 {
	if k <= 0 || tpot <= 0 {
		return 0
	}
	return k / (max(meanOutput-1, 1) * tpot)
}

// Sum is the sum of xs.
func Sum(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

// Mean is the mean of xs; 0 for none.
func Mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return Sum(xs) / float64(len(xs))
}

// StdDev is the population standard deviation of xs; 0 for none.
func StdDev(xs []float64) float64 {
	m := Mean(xs)
	var ss float64
	for _, x := range xs {
		ss += (x - m) * (x - m)
	}
	if len(xs) == 0 {
		return 0
	}
	return math.Sqrt(ss / float64(len(xs)))
}
