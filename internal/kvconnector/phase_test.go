package kvconnector

import (
	"testing"

	"github.com/tandem-serve/tandem/internal/kvxfer"
	"github.com/tandem-serve/tandem/internal/sched"
)

// TestFinishedPullStagesNoCancel: once a pull has ended, the request's
// phase leaves "loading", so finishing the request later stages no cancel
// for a pull that no longer exists (it used to, for every decode). A
// request that finishes while its pull still runs does cancel it.
func TestFinishedPullStagesNoCancel(t *testing.T) {
	c, err := NewConnector(ConnectorConfig{Role: RoleDecode, EngineID: "d"})
	if err != nil {
		t.Fatal(err)
	}
	remote := &kvxfer.RemoteParams{EngineID: "p", RequestID: "r", Host: "127.0.0.1", Port: 5600, BlockIDs: []int{0}}
	c.reqs["done"] = &connReq{remote: remote, phase: loading}
	c.reqs["running"] = &connReq{remote: remote, phase: loading}

	// The pull of "done" ended: its goroutine records it before reporting,
	// and the next Step (which runs before the request can finish) sees it.
	c.pulled = append(c.pulled, "done")
	if _, err := c.Step(nil); err != nil {
		t.Fatal(err)
	}
	if got := c.reqs["done"].phase; got != consumed {
		t.Fatalf("phase after the pull ended = %d, want consumed", got)
	}

	c.RequestFinished(&sched.Request{ID: "done"}, nil)
	if len(c.staged.cancels) != 0 {
		t.Fatalf("finishing a request whose pull ended staged cancels %v", c.staged.cancels)
	}
	c.RequestFinished(&sched.Request{ID: "running"}, nil)
	if len(c.staged.cancels) != 1 || c.staged.cancels[0] != "running" {
		t.Fatalf("finishing a request during its pull staged cancels %v, want [running]", c.staged.cancels)
	}
	c.Close()
}
