package kvxfer

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func TestLeaseTable(t *testing.T) {
	const lease = 30 * time.Second
	type step struct {
		at   time.Duration
		op   string // hold, hb, done, sweep, read, endread
		id   string
		want string // substring of the error, "" for success
		// released after the step (request ids and reasons)
		released []Release
		expired  int
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"an unread lease expires at its deadline, not before", []step{
			{at: 0, op: "hold", id: "a"},
			{at: 29 * time.Second, op: "sweep"},
			{at: 30 * time.Second, op: "sweep", expired: 1, released: []Release{{"a", []int{1, 2}, ReleasedExpired}}},
		}},
		{"done releases at once and a second done says already released", []step{
			{at: 0, op: "hold", id: "a"},
			{at: time.Second, op: "done", id: "a", released: []Release{{"a", []int{1, 2}, ReleasedDone}}},
			{at: 2 * time.Second, op: "done", id: "a", want: `request "a" is not held by engine P: it was already released`},
		}},
		{"a heartbeat extends the lease to now + 2/3 lease", []step{
			{at: 0, op: "hold", id: "a"},
			{at: 25 * time.Second, op: "hb", id: "a"},
			{at: 44 * time.Second, op: "sweep"},
			{at: 45 * time.Second, op: "sweep", expired: 1, released: []Release{{"a", []int{1, 2}, ReleasedExpired}}},
		}},
		{"an early heartbeat never shortens the lease", []step{
			{at: 0, op: "hold", id: "a"},
			{at: time.Second, op: "hb", id: "a"}, // now+20s < 30s: keep 30s
			{at: 29 * time.Second, op: "sweep"},
			{at: 30 * time.Second, op: "sweep", expired: 1, released: []Release{{"a", []int{1, 2}, ReleasedExpired}}},
		}},
		{"a read after expiry names how long ago the lease expired", []step{
			{at: 0, op: "hold", id: "a"},
			{at: 30 * time.Second, op: "sweep", expired: 1, released: []Release{{"a", []int{1, 2}, ReleasedExpired}}},
			{at: 33*time.Second + 200*time.Millisecond, op: "read", id: "a", want: "its lease expired 3.2 s ago"},
		}},
		{"a read past the deadline but before the sweep expires the lease on the spot", []step{
			{at: 0, op: "hold", id: "a"},
			{at: 31 * time.Second, op: "read", id: "a", want: "its lease expired 1.0 s ago", released: []Release{{"a", []int{1, 2}, ReleasedExpired}}},
		}},
		{"an unknown request is reported as unknown", []step{
			{at: 0, op: "read", id: "nope", want: `request "nope" is not held by engine P: unknown request`},
		}},
		{"a lease being read waits for the read to end before expiring", []step{
			{at: 0, op: "hold", id: "a"},
			{at: 29 * time.Second, op: "read", id: "a"},
			{at: 40 * time.Second, op: "sweep"},
			{at: 41 * time.Second, op: "endread", id: "a"},
			{at: 41 * time.Second, op: "sweep", expired: 1, released: []Release{{"a", []int{1, 2}, ReleasedExpired}}},
		}},
		{"done during a read releases when the read ends", []step{
			{at: 0, op: "hold", id: "a"},
			{at: 1 * time.Second, op: "read", id: "a"},
			{at: 2 * time.Second, op: "done", id: "a"},
			{at: 2 * time.Second, op: "read", id: "a", want: "it is being released"},
			{at: 3 * time.Second, op: "endread", id: "a", released: []Release{{"a", []int{1, 2}, ReleasedDone}}},
		}},
		{"holding a request twice is refused", []step{
			{at: 0, op: "hold", id: "a"},
			{at: 0, op: "hold", id: "a", want: "already held"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lt := newLeaseTable("P", lease)
			for i, s := range tc.steps {
				now := at(s.at)
				var err error
				expired := 0
				switch s.op {
				case "hold":
					err = lt.hold(s.id, []int{1, 2}, []uint64{7, 8}, now)
				case "hb":
					if nh := lt.heartbeat([]string{s.id}, now); len(nh) > 0 {
						err = errors.New("not held: " + strings.Join(nh, ","))
					}
				case "done":
					err = lt.done(s.id, now)
				case "sweep":
					expired = lt.sweep(now)
				case "read":
					var gens []uint64
					gens, _, err = lt.beginRead(s.id, []int{2}, true, now)
					if err == nil && !cmp.Equal(gens, []uint64{8}) {
						t.Fatalf("step %d: generations %v, want [8]", i, gens)
					}
				case "endread":
					lt.endRead(s.id, now)
				}
				if s.want == "" && err != nil {
					t.Fatalf("step %d (%s at %v): %v", i, s.op, s.at, err)
				}
				if s.want != "" && (err == nil || !strings.Contains(err.Error(), s.want)) {
					t.Fatalf("step %d (%s at %v): error %v, want it to contain %q", i, s.op, s.at, err, s.want)
				}
				if expired != s.expired {
					t.Fatalf("step %d (%s at %v): %d expired, want %d", i, s.op, s.at, expired, s.expired)
				}
				if diff := cmp.Diff(s.released, lt.takeReleased()); diff != "" {
					t.Fatalf("step %d (%s at %v): released (-want +got):\n%s", i, s.op, s.at, diff)
				}
			}
		})
	}
}

// The sweep must not stop at the first live lease: heartbeats make
// expiries unordered.
func TestLeaseSweepIsFull(t *testing.T) {
	lt := newLeaseTable("P", 30*time.Second)
	for i, id := range []string{"a", "b", "c", "d"} {
		if err := lt.hold(id, []int{i}, []uint64{0}, t0); err != nil {
			t.Fatal(err)
		}
	}
	lt.heartbeat([]string{"a", "c"}, at(20*time.Second)) // a, c → 40 s
	if n := lt.sweep(at(35 * time.Second)); n != 2 {
		t.Fatalf("sweep expired %d leases, want 2 (b and d)", n)
	}
	got := map[string]bool{}
	for _, r := range lt.takeReleased() {
		got[r.RequestID] = true
	}
	if !got["b"] || !got["d"] || len(got) != 2 {
		t.Fatalf("released %v, want b and d", got)
	}
	if lt.nblocks != 2 {
		t.Fatalf("%d blocks held, want 2", lt.nblocks)
	}
}

func TestLeaseReadOfForeignBlockIsRefused(t *testing.T) {
	lt := newLeaseTable("P", 30*time.Second)
	lt.hold("a", []int{4, 5}, []uint64{0, 0}, t0)
	_, _, err := lt.beginRead("a", []int{5, 6}, true, t0)
	wantErr(t, err, ErrBadBlock, "block 6 is not one of the 2 blocks")
	if l := lt.held["a"]; l.readers != 0 {
		t.Fatalf("refused read left %d readers pinned", l.readers)
	}
}

func TestTombstonesAreBounded(t *testing.T) {
	lt := newLeaseTable("P", time.Second)
	for i := range 3 {
		id := string(rune('a' + i))
		lt.hold(id, nil, nil, t0)
		lt.done(id, t0)
	}
	lt.sweep(at(tombstoneTTL + time.Second))
	if len(lt.gone) != 0 || len(lt.goneFIFO) != 0 {
		t.Fatalf("tombstones kept past their TTL: %d / %d", len(lt.gone), len(lt.goneFIFO))
	}
}
