package kvconnector

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/openai"
	"github.com/tandem-serve/tandem/internal/sched"
	"github.com/tandem-serve/tandem/internal/testutil"
	"github.com/tandem-serve/tandem/internal/testutil/loaded"
)

// stall is how late the decode legs of these tests come: past the 30 s
// lease and the signature's 30 s clock-skew allowance.
const stall = 65 * time.Second

// TestExpiredParamsAreNotForgeries: a decode leg that comes after its
// params expired (a decode stalled for 65 s) is a timing fault, not a
// forgery. The decode must say so, count it, dial nothing (the prefill's
// hold has ended), and leave the answer to --kv-load-failure-policy:
// recompute answers as a colocated engine, fail answers a 500 that names
// the expiry. Params altered by a client are still refused as forged.
func TestExpiredParamsAreNotForgeries(t *testing.T) {
	secret := testSecret(t)
	clk := testutil.NewFakeClock(time.Now())
	ref := newPD(t, pdOpts{})
	p := newPD(t, pdOpts{role: RolePrefill, secret: secret, clock: clk})
	prompt := promptOf(5101, 40)
	want := run(t, ref.e, &engine.Request{Prompt: prompt, Params: greedy(8)})

	// late returns the prefill's params for prompt once they have expired
	// on the shared clock (the prefill's lease expired with them).
	late := func(t *testing.T) map[string]any {
		kv := prefill(t, p, prompt, greedy(8))
		expired := value(t, p.m.KVLeasesExpired)
		clk.Advance(stall)
		p.waitIdle(t)
		if v := value(t, p.m.KVLeasesExpired) - expired; v != 1 {
			t.Fatalf("tandem:kv_leases_expired_total grew by %v on the prefill, want 1", v)
		}
		return kv
	}
	rejected := func(d *pdEngine, reason string) float64 {
		return value(t, d.m.KVParamsRejected.WithLabelValues(reason))
	}

	t.Run("recompute answers as a colocated engine", func(t *testing.T) {
		d := newPD(t, pdOpts{role: RoleDecode, secret: secret, clock: clk, policy: sched.LoadFailureRecompute})
		kv := late(t)
		got := decode(t, d, prompt, greedy(8), kv)
		if got.final.Finish != engine.FinishLength {
			t.Fatalf("decode leg with expired params: finish %q (%v), want length", got.final.Finish, got.final.Err)
		}
		if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
			t.Errorf("tokens (-colocated +recomputed):\n%s", diff)
		}
		if v := rejected(d, "expired"); v != 1 {
			t.Errorf("tandem:kv_params_rejected_total{reason=expired} = %v, want 1", v)
		}
		if v := rejected(d, "bad_signature"); v != 0 {
			t.Errorf("tandem:kv_params_rejected_total{reason=bad_signature} = %v, want 0", v)
		}
		if v := counter(t, d.m, "external_kv_transfer"); v != 0 {
			t.Errorf("%v prompt tokens counted as transferred from expired params", v)
		}
		if v := value(t, d.m.KVTransferBytes); v != 0 {
			t.Errorf("%v bytes pulled with expired params", v)
		}
	})

	t.Run("fail answers a 500 that names the expiry", func(t *testing.T) {
		d := newPD(t, pdOpts{role: RoleDecode, secret: secret, clock: clk, policy: sched.LoadFailureFail})
		kv := late(t)
		status, msg := complete(t, d, prompt, kv)
		if status != http.StatusInternalServerError {
			t.Errorf("status %d, want 500", status)
		}
		for _, s := range []string{"kv_transfer_params expired", "--kv-load-failure-policy recompute"} {
			if !strings.Contains(msg, s) {
				t.Errorf("error %q does not say %q", msg, s)
			}
		}
		if strings.Contains(msg, "not issued by an engine of this cluster") {
			t.Errorf("error %q calls expired params forged", msg)
		}
		if v := rejected(d, "expired"); v != 1 {
			t.Errorf("tandem:kv_params_rejected_total{reason=expired} = %v, want 1", v)
		}
		again := run(t, d.e, &engine.Request{Prompt: prompt, Params: greedy(1)})
		if again.final.Usage.CachedTokens != 0 {
			t.Errorf("%d prompt tokens hit the cache after expired params; want none", again.final.Usage.CachedTokens)
		}
	})

	t.Run("altered params are still refused as forged", func(t *testing.T) {
		d := newPD(t, pdOpts{role: RoleDecode, secret: secret, clock: clk, policy: sched.LoadFailureRecompute})
		for _, stale := range []bool{false, true} {
			kv := prefill(t, p, prompt, greedy(8))
			if stale {
				clk.Advance(stall)
				p.waitIdle(t)
			}
			// A client that moves the expiry forward cannot keep the
			// signature valid.
			sig := kv[kvxfer.SignatureParam].(string)
			parts := strings.SplitN(sig, ".", 3)
			kv[kvxfer.SignatureParam] = parts[0] + "." + "9" + parts[1] + "." + parts[2]
			status, msg := complete(t, d, prompt, kv)
			if status != http.StatusBadRequest || !strings.Contains(msg, "not issued by an engine of this cluster") {
				t.Errorf("stale=%v: status %d, %q; want a 400 saying the params were not issued by this cluster", stale, status, msg)
			}
			if !stale {
				// Refused before the pull: the prefill frees at the lease.
				clk.Advance(stall)
				p.waitIdle(t)
			}
		}
		if v := rejected(d, "bad_signature"); v != 2 {
			t.Errorf("tandem:kv_params_rejected_total{reason=bad_signature} = %v, want 2", v)
		}
		if v := rejected(d, "expired"); v != 0 {
			t.Errorf("tandem:kv_params_rejected_total{reason=expired} = %v, want 0", v)
		}
	})
}

// complete sends a completion with kv to d's API and returns the status
// and the error message, if any.
func complete(t *testing.T, d *pdEngine, prompt []int32, kv map[string]any) (int, string) {
	t.Helper()
	srv, err := openai.NewServer(openai.Config{Backend: d.e, Tokenizer: loaded.Stories(t).Tokenizer, ModelName: "stories260K", Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	body, _ := json.Marshal(map[string]any{"model": "stories260K", "prompt": prompt, "max_tokens": 8, "kv_transfer_params": kv})
	resp, err := ts.Client().Post(ts.URL+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, e.Error.Message
}

// TestExpiredConversationParamsRecomputeTheHistory: a turn-2 prefill given
// a decode's conversation params after their signature expired (the hold's
// TTL and the skew allowance passed) counts them as expired, not forged,
// and under the recompute policy computes the history itself.
func TestExpiredConversationParamsRecomputeTheHistory(t *testing.T) {
	secret := testSecret(t)
	clk := testutil.NewFakeClock(time.Now())
	const ttl = 10 * time.Second
	ref := newPD(t, pdOpts{})
	p1 := newPD(t, pdOpts{role: RolePrefill, bidirectional: true, secret: secret, clock: clk})
	p2 := newPD(t, pdOpts{role: RolePrefill, bidirectional: true, secret: secret, clock: clk, policy: sched.LoadFailureRecompute})
	d := newPD(t, pdOpts{role: RoleDecode, bidirectional: true, secret: secret, clock: clk, holdTTL: ttl})
	prompt1 := promptOf(5201, 80)
	out1, conv := turn1(t, p1, d, prompt1, 40)
	clk.Advance(ttl + stall)
	d.waitIdle(t) // the hold expired on the decode
	prompt2 := concat(prompt1, out1, promptOf(5202, 10))
	want := run(t, ref.e, &engine.Request{Prompt: prompt2, Params: greedy(12)})
	kv2 := prefillWith(t, p2, prompt2, greedy(12), conv)
	if v := value(t, p2.m.KVParamsRejected.WithLabelValues("expired")); v != 1 {
		t.Errorf("tandem:kv_params_rejected_total{reason=expired} = %v on the turn-2 prefill, want 1", v)
	}
	if v := value(t, p2.m.HistoryRecomputed.WithLabelValues("expired")); v != 1 {
		t.Errorf("tandem:kv_history_recomputed_total{reason=expired} = %v, want 1", v)
	}
	if v := value(t, p2.m.HistoryTokensPulled); v != 0 {
		t.Errorf("%v history tokens pulled with expired params", v)
	}
	got := decode(t, d, prompt2, greedy(12), kv2)
	if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
		t.Errorf("turn 2 differs from the colocated engine (-colocated +disaggregated):\n%s", diff)
	}
	releaseConversations(t, d)
}
