package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tandem-serve/tandem/internal/bench"
	"github.com/tandem-serve/tandem/internal/hoststat"
	"github.com/tandem-serve/tandem/internal/progress"
)

// Metrics whose value must be 0 on every engine once the load has drained.
const (
	MetricKVUsage = "vllm:kv_cache_usage_perc"
	MetricHeld    = "tandem:kv_blocks_held"
)

// Config is one soak run.
type Config struct {
	Client    *bench.Client
	Model     string
	Prompts   [][]int32 // used in turn
	MaxTokens int
	// Rate is the Poisson arrival rate (req/s); 0 means a closed loop of
	// Concurrency requests. With Rate, Concurrency > 0 caps requests in flight.
	Rate        float64
	Concurrency int
	Seed        uint64
	Duration    time.Duration
	// Deadline is the hard per-request limit: a request still running at it
	// is cancelled and counted as hung.
	Deadline time.Duration
	Faults   []Fault
	// Inject carries out a fault and returns once the engine has recovered
	// (restarted and healthy, or continued).
	Inject func(context.Context, Fault) error
	// PIDs returns the current process id of each engine to sample.
	PIDs        func() map[string]int
	SampleEvery time.Duration
	// MetricsURLs are the engines' base URLs, scraped after the load for
	// MetricKVUsage and MetricHeld until both are 0 or DrainTimeout passes.
	MetricsURLs  map[string]string
	DrainTimeout time.Duration
	Log          io.Writer
	// Progress, when set, shows the load as it runs: its time against
	// Duration, requests answered, failed and in flight.
	Progress *progress.Display
}

// FaultResult is a fault as carried out.
type FaultResult struct {
	Fault
	Took time.Duration // until the engine was back
	Err  string
}

// Drained is an engine's KV state after the load.
type Drained struct {
	Engine   string
	Usage    float64
	Held     float64
	HeldSeen bool // false when the engine exports no MetricHeld
	After    time.Duration
	Err      string
}

// Result is what a soak measured.
type Result struct {
	Sent     int
	Tally    Tally
	Hung     int // cancelled at the deadline, or never returned
	Faults   []FaultResult
	Lives    []*Life
	Drain    []Drained
	Elapsed  time.Duration
	Deadline time.Duration
}

// Run drives the load and the faults for c.Duration, waits for every
// request, then for the engines' KV to drain, sampling memory throughout.
func Run(ctx context.Context, c Config) (*Result, error) {
	if c.Duration <= 0 || c.Deadline <= 0 || len(c.Prompts) == 0 {
		return nil, errors.New("soak: need a positive duration and deadline and at least one prompt")
	}
	logf := func(format string, args ...any) {
		if c.Log != nil {
			fmt.Fprintf(c.Log, "soak: "+format+"\n", args...)
		}
	}
	start := time.Now()
	res := &Result{Tally: Tally{}, Deadline: c.Deadline}
	var mu sync.Mutex // guards res.Tally, res.Hung, res.Lives

	sampleCtx, stopSampling := context.WithCancel(ctx)
	var sampler sync.WaitGroup
	if c.PIDs != nil && c.SampleEvery > 0 {
		sampler.Go(func() {
			lives := map[[2]any]*Life{}
			t := time.NewTicker(c.SampleEvery)
			defer t.Stop()
			for {
				for name, pid := range c.PIDs() {
					b, err := hoststat.RSS(pid)
					if err != nil {
						continue // between a kill and its restart
					}
					mu.Lock()
					l := lives[[2]any{name, pid}]
					if l == nil {
						l = &Life{Engine: name, PID: pid}
						lives[[2]any{name, pid}] = l
						res.Lives = append(res.Lives, l)
					}
					l.Samples = append(l.Samples, RSSSample{At: time.Since(start), Bytes: b})
					mu.Unlock()
				}
				select {
				case <-sampleCtx.Done():
					return
				case <-t.C:
				}
			}
		})
	}

	loadCtx, stopLoad := context.WithTimeout(ctx, c.Duration)
	defer stopLoad()
	var faults sync.WaitGroup
	faults.Go(func() {
		for _, f := range c.Faults {
			if !sleepUntil(loadCtx, start.Add(f.At)) {
				return
			}
			logf("%v", f)
			t0 := time.Now()
			// The fault finishes (restart, SIGCONT) even if the load ends.
			err := c.Inject(context.WithoutCancel(ctx), f)
			fr := FaultResult{Fault: f, Took: time.Since(t0)}
			if err != nil {
				fr.Err = err.Error()
				logf("fault %v failed: %v", f, err)
			}
			mu.Lock()
			res.Faults = append(res.Faults, fr)
			mu.Unlock()
		}
	})

	stage := c.Progress.Start("soak load", int64(c.Duration), progress.Time)
	answered, failed, running := stage.Counter("answered", 0), stage.Warning("failed"), stage.Gauge("in flight")
	var inflight sync.WaitGroup
	var pending sync.Map // request ids in flight, for those that never return
	do := func(i int) {
		pending.Store(i, true)
		defer pending.Delete(i)
		running.Add(1)
		defer running.Add(-1)
		rctx, cancel := context.WithTimeout(ctx, c.Deadline)
		defer cancel()
		o := c.Client.Stream(rctx, bench.CompletionRequest{Model: c.Model, Prompt: c.Prompts[i%len(c.Prompts)],
			MaxTokens: c.MaxTokens, IgnoreEOS: true})
		if o.Err != nil && rctx.Err() == context.DeadlineExceeded && !errors.Is(o.Err, context.DeadlineExceeded) {
			o.Err = fmt.Errorf("%w: %v", context.DeadlineExceeded, o.Err)
		}
		k := Classify(o)
		if strings.HasPrefix(k, "ok:") {
			answered.Add(1)
		} else {
			failed.Add(1)
		}
		mu.Lock()
		res.Tally[k]++
		if k == KindHung {
			res.Hung++
		}
		mu.Unlock()
	}
	if c.Rate > 0 {
		n := int(math.Ceil(c.Rate*c.Duration.Seconds())) + 1
		var sem chan struct{}
		if c.Concurrency > 0 {
			sem = make(chan struct{}, c.Concurrency)
		}
	arrivals:
		for i, at := range bench.GammaArrivals(c.Seed, n, c.Rate, 1) {
			if at >= c.Duration || !sleepUntil(loadCtx, start.Add(at)) {
				break
			}
			if sem != nil {
				select {
				case sem <- struct{}{}:
				case <-loadCtx.Done():
					break arrivals
				}
			}
			res.Sent++
			inflight.Go(func() {
				do(i)
				if sem != nil {
					<-sem
				}
			})
		}
	} else {
		var next sync.Mutex
		i := 0
		for range max(c.Concurrency, 1) {
			inflight.Go(func() {
				for loadCtx.Err() == nil {
					next.Lock()
					id := i
					i++
					res.Sent++
					next.Unlock()
					do(id)
				}
			})
		}
	}
	<-loadCtx.Done()
	faults.Wait()
	returned := make(chan struct{})
	go func() { inflight.Wait(); close(returned) }()
	select {
	case <-returned:
	case <-time.After(c.Deadline + 10*time.Second):
		n := 0
		pending.Range(func(any, any) bool { n++; return true })
		mu.Lock()
		res.Hung += n
		res.Tally["hung: never returned"] += n
		mu.Unlock()
		logf("%d requests never returned", n)
	}
	stage.Done()
	logf("load stopped after %v: %d requests sent; waiting for the KV to drain", time.Since(start).Round(time.Millisecond), res.Sent)

	drainStart := time.Now()
	res.Drain = drain(ctx, c.MetricsURLs, c.DrainTimeout, drainStart)
	res.Elapsed = time.Since(start)
	stopSampling()
	sampler.Wait()
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(res.Lives, func(i, j int) bool {
		if res.Lives[i].Engine != res.Lives[j].Engine {
			return res.Lives[i].Engine < res.Lives[j].Engine
		}
		return res.Lives[i].Samples[0].At < res.Lives[j].Samples[0].At
	})
	return res, ctx.Err()
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// drain polls every engine's /metrics until MetricKVUsage and MetricHeld
// are 0 on all of them, or timeout passes, and returns the last readings.
func drain(ctx context.Context, urls map[string]string, timeout time.Duration, start time.Time) []Drained {
	names := make([]string, 0, len(urls))
	for n := range urls {
		names = append(names, n)
	}
	slices.Sort(names)
	client := &http.Client{Timeout: 2 * time.Second}
	var out []Drained
	for {
		out = out[:0]
		clean := true
		for _, n := range names {
			d := scrape(ctx, client, n, urls[n])
			d.After = time.Since(start)
			out = append(out, d)
			if d.Err != "" || d.Usage != 0 || d.Held != 0 {
				clean = false
			}
		}
		if clean || time.Since(start) > timeout || ctx.Err() != nil {
			return out
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func scrape(ctx context.Context, client *http.Client, name, url string) Drained {
	d := Drained{Engine: name}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(url, "/")+"/metrics", nil)
	if err != nil {
		d.Err = err.Error()
		return d
	}
	resp, err := client.Do(req)
	if err != nil {
		d.Err = err.Error()
		return d
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		d.Err = err.Error()
		return d
	}
	var ok bool
	if d.Usage, ok, _ = ParseGauge(strings.NewReader(string(body)), MetricKVUsage); !ok {
		d.Err = MetricKVUsage + " not exported"
	}
	d.Held, d.HeldSeen, _ = ParseGauge(strings.NewReader(string(body)), MetricHeld)
	return d
}
