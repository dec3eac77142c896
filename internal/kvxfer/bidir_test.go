package kvxfer

import (
	"testing"
	"time"
)

func TestFixedHoldsIgnoreHeartbeatsAndAreEvictedOldestFirst(t *testing.T) {
	tab := newLeaseTable("d", 30*time.Second)
	gens := []uint64{0, 0}
	tab.holdFor("old", []int{1, 2}, gens, at(0), 480*time.Second, true)
	tab.holdFor("new", []int{3, 4}, gens, at(time.Second), 480*time.Second, true)
	tab.hold("decode-leg", []int{5, 6}, gens, at(2*time.Second)) // a waiting decode's lease
	tab.heartbeat([]string{"old", "decode-leg"}, at(470*time.Second))
	if got := tab.held["old"].expiry; !got.Equal(at(480 * time.Second)) {
		t.Fatalf("a heartbeat moved a conversation hold's expiry to %v", got)
	}
	if n := tab.evict(1, at(3*time.Second)); n != 2 {
		t.Fatalf("evict(1) freed %d blocks, want the oldest hold's 2", n)
	}
	if _, ok := tab.held["old"]; ok {
		t.Fatal("the oldest hold survived eviction")
	}
	if n := tab.evict(100, at(3*time.Second)); n != 2 {
		t.Fatalf("evict(100) freed %d blocks, want 2 (only fixed holds may go)", n)
	}
	if _, ok := tab.held["decode-leg"]; !ok {
		t.Fatal("a waiting decode's lease was evicted")
	}
	rel := tab.takeReleased()
	if len(rel) != 2 || rel[0].Reason != ReleasedEvicted {
		t.Fatalf("released %+v", rel)
	}
}

func TestExpiryGateAndRegistrationGeneration(t *testing.T) {
	r := newRig(t, rigOpts{transport: TransportTCP})
	now := time.Now()
	for i, tc := range []struct {
		name     string
		deadline time.Time
		gen      func() uint64
		want     error
	}{
		{"a deadline far ahead pulls", now.Add(time.Minute), nil, nil},
		{"no deadline pulls", time.Time{}, nil, nil},
		{"a deadline within the margin is declined", now.Add(ExpiryMargin / 2), nil, ErrExpired},
		{"a deadline passed is declined", now.Add(-time.Second), nil, ErrExpired},
		{"the producer's own generation pulls", now.Add(time.Minute), func() uint64 { return r.prod.Info().Generation }, nil},
		{"another generation names memory that is gone", now.Add(time.Minute), func() uint64 { return r.prod.Info().Generation + 2 }, ErrPeerRestarted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := "conv-" + string(rune('a'+i))
			if err := r.prod.HoldFor(req, []int{i + 1}, time.Now(), 480*time.Second, true); err != nil {
				t.Fatal(err)
			}
			p := r.params(req, i+1)
			p.Deadline = tc.deadline
			if tc.gen != nil {
				p.Generation = tc.gen()
			}
			dst := newLocalBlocks(1, tiny.BlockBytes)
			err := r.cons.Pull(ctxT(t), p, dst)
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				checkBlocks(t, r.pool, []int{i + 1}, dst)
				return
			}
			wantErr(t, err, tc.want)
			if tc.want == ErrExpired && FailureReason(err) != "expired" {
				t.Fatalf("reason %q", FailureReason(err))
			}
		})
	}
	// Same host, same clock: the measured offset is within the round trip
	// (the generation mismatch dropped the peer: handshake anew).
	r.hold(t, "after", 9)
	if err := r.cons.Pull(ctxT(t), r.params("after", 9), newLocalBlocks(1, tiny.BlockBytes)); err != nil {
		t.Fatal(err)
	}
	p, _ := r.cons.peerFor(r.peer)
	p.mu.Lock()
	off, rtt := p.clockOffset, p.clockRTT
	p.mu.Unlock()
	if rtt <= 0 || off > rtt || off < -rtt {
		t.Fatalf("clock offset %v with round trip %v on one host", off, rtt)
	}
}
