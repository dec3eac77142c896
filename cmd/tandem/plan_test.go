package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/tandem-serve/tandem/internal/planner"
	"github.com/tandem-serve/tandem/internal/proxy"
)

func TestPlanPrintsTheProxysDecision(t *testing.T) {
	pre, _ := startSimEngine(t, "--kv-port", "0")
	dec, _ := startSimEngine(t)
	_, url := startTestProxy(t, proxy.Config{Prefill: []string{pre}, Decode: []string{dec}, PDDecider: "conditional",
		Planner: &planner.Config{TTFT: time.Second, TPOT: 50 * time.Millisecond}, PlanInterval: 50 * time.Millisecond})
	waitHealthy(t, url)
	var out bytes.Buffer
	deadline := time.Now().Add(10 * time.Second)
	for {
		out.Reset()
		if err := plan(&out, []string{"--url", url}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "no decision yet") || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, want := range []string{"objectives: TTFT 1s, TPOT 50ms", "pools now: 1 prefill, 1 decode; publishing only", "decision at", "held: too few requests"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("tandem plan printed no %q:\n%s", want, out.String())
		}
	}
}

func TestPlanSaysHowToTurnThePlannerOn(t *testing.T) {
	pre, _ := startSimEngine(t, "--kv-port", "0")
	dec, _ := startSimEngine(t)
	_, url := startTestProxy(t, proxy.Config{Prefill: []string{pre}, Decode: []string{dec}})
	err := plan(&bytes.Buffer{}, []string{"--url", url})
	if err == nil || !strings.Contains(err.Error(), "--slo-ttft") {
		t.Fatalf("err %v, want one naming --slo-ttft", err)
	}
}

func TestPlannerFlagsNeedBothObjectives(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"one objective", []string{"--prefill", "http://a:1", "--decode", "http://b:1", "--slo-ttft", "1s"}, "--slo-tpot"},
		{"acting without the planner", []string{"--prefill", "http://a:1", "--decode", "http://b:1", "--planner-act"}, "--slo-ttft"},
		{"scaling without kubernetes", []string{"--prefill", "http://a:1", "--decode", "http://b:1", "--slo-ttft", "1s", "--slo-tpot", "50ms", "--planner-scale"}, "--discovery kubernetes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseProxyFlags(c.args)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want one naming %s", err, c.want)
			}
		})
	}
	f, err := parseProxyFlags([]string{"--prefill", "http://a:1", "--decode", "http://b:1", "--slo-ttft", "1s", "--slo-tpot", "50ms", "--planner-act"})
	if err != nil || f.cfg.Planner == nil || f.cfg.Planner.TTFT != time.Second || !f.cfg.PlannerAct {
		t.Fatalf("planner flags: %+v, %v", f, err)
	}
}

func TestPlanPrintsTheCadenceSetOnTheDecodePool(t *testing.T) {
	var out bytes.Buffer
	writePlan(&out, planAnswer{Acting: true, Prefill: []string{"http://p"}, Decode: []string{"http://d1", "http://d2"},
		Decision: &planner.Decision{Prefill: 1, Decode: 2, PrefillScheduleInterval: 4},
		Cadence: &planCadence{PrefillScheduleInterval: 4, Applied: map[string]int{"http://d1": 4},
			Failed: map[string]string{"http://d2": "answered 401 Unauthorized: invalid API key"}}})
	for _, want := range []string{"prefill cadence 4 set on 1 of the 2 decode engines", "not set on http://d2: answered 401"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("tandem plan printed no %q:\n%s", want, out.String())
		}
	}
}

func TestPlanPrintsTheEnginesFinishingTheirOldWork(t *testing.T) {
	var out bytes.Buffer
	writePlan(&out, planAnswer{Acting: true, Decode: []string{"http://d1", "http://d2"},
		Finishing: map[string]string{"http://d2": "prefill→decode"}, Decision: &planner.Decision{Decode: 2}})
	if want := "finishing: http://d2: moved prefill→decode, its old role's work still running"; !strings.Contains(out.String(), want) {
		t.Errorf("tandem plan printed no %q:\n%s", want, out.String())
	}
}

// TestPlanSaysTheLastMoveIsNotMeasuredYet: a decision held while the last
// move is being measured says so, and so does one that did not want to
// move.
func TestPlanSaysTheLastMoveIsNotMeasuredYet(t *testing.T) {
	const settling = "settling after the move to 1P:3D at 16:05:11.400: 4 of 13 requests measured on it (of the 25 fitted)"
	for _, d := range []*planner.Decision{
		{Prefill: 1, Decode: 3, Best: planner.Split{P: 2, D: 2}, Held: settling, Settling: settling},
		{Prefill: 1, Decode: 3, Best: planner.Split{P: 1, D: 3}, Settling: settling},
	} {
		var out bytes.Buffer
		writePlan(&out, planAnswer{Acting: true, Prefill: []string{"http://p"}, Decode: []string{"http://d1", "http://d2", "http://d3"}, Decision: d})
		if got := strings.Count(out.String(), settling); got != 1 {
			t.Errorf("tandem plan printed %q %d times, want once:\n%s", settling, got, out.String())
		}
	}
}

// TestPlanSaysWhatTheThresholdIsToTheDecider: under the priced decider the
// planner's threshold is informational and only the unpriced requests'
// fallback; the window's remote share is printed beside the model's.
func TestPlanSaysWhatTheThresholdIsToTheDecider(t *testing.T) {
	d := &planner.Decision{Prefill: 1, Decode: 2, Threshold: 480, Fit: planner.Fit{RemoteFraction: 0.25}}
	for _, c := range []struct {
		dec  planDecider
		want []string
	}{
		{planDecider{Name: "priced", Threshold: "fallback", Requests: 40, Remote: 18, ByThreshold: 3},
			[]string{"decider priced: each request by its price", "the threshold is informational", "40 requests, 45% prefilled remotely (the model: 25% at the threshold), 3 by the threshold"}},
		{planDecider{Name: "conditional", Threshold: "decides", Requests: 40, Remote: 10},
			[]string{"decider conditional: every request by the threshold; in the window 40 requests, 25% prefilled remotely (the model: 25% at the threshold)\n"}},
		{planDecider{Name: "always", Threshold: "unused"}, []string{"decider always: the threshold is informational, the decider does not use it\n"}},
	} {
		var out bytes.Buffer
		writePlan(&out, planAnswer{Prefill: []string{"http://p"}, Decode: []string{"http://d1", "http://d2"}, Decision: d, Decider: &c.dec})
		for _, want := range c.want {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%s: tandem plan printed no %q:\n%s", c.dec.Name, want, out.String())
			}
		}
	}
}
