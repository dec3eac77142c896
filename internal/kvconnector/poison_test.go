package kvconnector

import (
	"errors"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/tandem-serve/tandem/internal/engine"
	"github.com/tandem-serve/tandem/internal/kvxfer"
)

// testSecret is a cluster secret for engines whose params are signed.
func testSecret(t *testing.T) kvxfer.Secret {
	t.Helper()
	s, err := kvxfer.NewSecret([]byte("kvconnector-test-secret-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestParamsForAnotherPromptCannotPoisonThePrefixCache replays a prefill's
// params for prompt X with another prompt Y of the same length. Were the
// decode to pull X's KV into Y's blocks, its prefix cache would map Y's
// block hashes to X's KV, and a later request extending Y would be
// answered from X's KV. The decode must refuse Y's leg with a 400 before
// dialing or allocating, tell the prefill to free X's blocks, and answer
// Y+Z as a colocated engine does.
func TestParamsForAnotherPromptCannotPoisonThePrefixCache(t *testing.T) {
	for _, signed := range []bool{true, false} {
		name := map[bool]string{true: "with a cluster secret", false: "without a secret"}[signed]
		t.Run(name, func(t *testing.T) {
			var secret kvxfer.Secret
			if signed {
				secret = testSecret(t)
			}
			ref := newPD(t, pdOpts{})
			p := newPD(t, pdOpts{role: RolePrefill, secret: secret})
			d := newPD(t, pdOpts{role: RoleDecode, secret: secret})
			x, y := promptOf(4001, 200), promptOf(4002, 200)
			kv := prefill(t, p, x, greedy(1))

			_, err := d.e.Submit(t.Context(), &engine.Request{Prompt: y, Params: greedy(4), KVTransfer: typed(t, kv)})
			var ire *engine.InvalidRequestError
			if !errors.As(err, &ire) || ire.Param != kvParam || !strings.Contains(ire.Message, "another prompt") {
				t.Fatalf("decode leg with X's params and prompt Y: Submit = %v, want a kv_transfer_params 400 saying they were issued for another prompt", err)
			}
			if st := d.e.Stats(); st.FreeBlocks != st.TotalBlocks || st.Waiting != 0 {
				t.Errorf("the decode allocated for a refused leg: %+v", st)
			}
			p.waitIdle(t) // told to free X's blocks, not left to the lease

			yz := append(append([]int32(nil), y...), promptOf(4003, 40)...)
			want := run(t, ref.e, &engine.Request{Prompt: yz, Params: greedy(8)})
			got := run(t, d.e, &engine.Request{Prompt: yz, Params: greedy(8)})
			if diff := gocmp.Diff(want.tokens, got.tokens); diff != "" {
				t.Errorf("Y+Z on the decode differs from a colocated engine (-colocated +decode):\n%s", diff)
			}
			if got.final.Usage.CachedTokens != 0 {
				t.Errorf("Y+Z: %d cached tokens, want 0 (nothing of Y was ever computed on the decode)", got.final.Usage.CachedTokens)
			}

			// The honest leg still works, with X's own params.
			kv = prefill(t, p, x, greedy(4))
			wantX := run(t, ref.e, &engine.Request{Prompt: x, Params: greedy(4)})
			gotX := decode(t, d, x, greedy(4), kv)
			if diff := gocmp.Diff(wantX.tokens, gotX.tokens); diff != "" {
				t.Errorf("honest decode leg (-colocated +disaggregated):\n%s", diff)
			}
			if gotX.final.Usage.CachedTokens != len(x)-1 {
				t.Errorf("honest decode leg: %d cached tokens, want %d", gotX.final.Usage.CachedTokens, len(x)-1)
			}
		})
	}
}
