package engine

import (
	"strconv"
	"time"

	"github.com/tandem-serve/tandem/internal/sample"
	"github.com/tandem-serve/tandem/internal/sched"
)

// draw is one request's sampling in a step.
type draw struct {
	rs     *reqState
	logits []float32
	tok    int32
	lp     *sample.Logprob
}

// sampleAll samples every request of the batch that reached the end of its
// known tokens. The draws run in parallel on the model's worker pool — each
// request has its own Sampler and random stream, so the tokens do not depend
// on how the requests are split — and the rest (detokenizing, stops, events)
// runs here, in batch order.
func (e *Engine) sampleAll(batch []sched.Scheduled, logits [][]float32, now time.Time) []sched.Result {
	draws := e.draws[:0]
	for i, sc := range batch {
		if rs := e.reqs[sc.Req.ID]; sc.Sample && rs != nil {
			draws = append(draws, draw{rs: rs, logits: logits[i]})
		}
	}
	e.draws = draws[:0]
	if len(draws) == 0 {
		return nil
	}
	e.model.Pool().Parallel(len(draws), func(lo, hi int) {
		for j := lo; j < hi; j++ {
			d := &draws[j]
			d.tok, d.lp = d.rs.sampler.Sample(d.logits, d.rs.req.Prompt, d.rs.sr.Output())
		}
	})
	results := make([]sched.Result, 0, len(draws))
	for _, d := range draws {
		results = append(results, e.sampleOne(d.rs, d.tok, d.lp, now))
	}
	clear(draws) // drop references to finished requests until the next step
	return results
}

// sampleOne samples rs's next token, decides whether it ends the request
// and queues the token and its text for the client.
func (e *Engine) sampleOne(rs *reqState, tok int32, lp *sample.Logprob, now time.Time) sched.Result {
	p := &rs.req.Params
	n := len(rs.sr.Output()) + 1
	ev := Event{Tokens: []int32{tok}}
	if lp != nil {
		tl := TokenLogprob{Token: lp.Token, Logprob: lp.Logprob}
		for _, t := range lp.Top {
			tl.Top = append(tl.Top, TopLogprob{Token: t.Token, Logprob: t.Logprob})
		}
		ev.Logprobs = []TokenLogprob{tl}
	}
	res := sched.Result{ID: rs.id, Token: tok}
	checkStops := n >= p.MinTokens
	if checkStops && rs.stopIDs[tok] {
		res.Finish = sched.FinishedStopped
		if rs.userStops[tok] {
			rs.stopReason = strconv.Itoa(int(tok))
		}
		if p.IncludeStopStrInOutput {
			ev.Text = rs.dec.Add(tok)
		}
		ev.Text += rs.dec.Flush()
		if rs.stop != nil {
			emit, _, _ := rs.stop.Push(ev.Text)
			ev.Text = emit + rs.stop.Flush()
		}
	} else {
		text := rs.dec.Add(tok)
		last := n >= rs.maxTokens
		if last {
			text += rs.dec.Flush()
		}
		switch {
		case rs.stop == nil:
			ev.Text = text
		case !checkStops:
			ev.Text = text
		default:
			emit, stopped, matched := rs.stop.Push(text)
			ev.Text = emit
			if stopped {
				res.Finish, rs.stopReason = sched.FinishedStopped, matched
			} else if last {
				ev.Text += rs.stop.Flush()
			}
		}
		if res.Finish == 0 && last {
			res.Finish = sched.FinishedLength
		}
	}
	if rs.firstToken.IsZero() {
		ev.Timing = rs.timing(now)
	}
	rs.out.push(ev, false)

	if e.m != nil {
		e.m.GenerationTokens.Inc()
		if rs.firstToken.IsZero() {
			e.m.TimeToFirstToken.Observe(now.Sub(rs.arrival).Seconds())
			cached, ext := rs.sr.NumCachedTokens(), rs.sr.NumExternalTokens()
			e.m.PromptTokens.Add(float64(len(rs.req.Prompt)))
			e.m.PromptTokensBySrc.WithLabelValues("local_cache_hit").Add(float64(cached))
			e.m.PromptTokensBySrc.WithLabelValues("external_kv_transfer").Add(float64(ext))
			e.m.PromptTokensBySrc.WithLabelValues("local_compute").Add(float64(max(len(rs.req.Prompt)-cached-ext, 0)))
		} else {
			e.m.InterTokenLatency.Observe(now.Sub(rs.lastToken).Seconds())
		}
	}
	if rs.firstToken.IsZero() {
		rs.firstToken = now
	}
	rs.lastToken = now
	return res
}
