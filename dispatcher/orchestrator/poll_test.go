package orchestrator

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	testclock "k8s.io/utils/clock/testing"
)

// waitUntil waits, within a deadline, until cond holds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// An orchestrator that answers polls at once, with nothing, is polled no
// more than once per minPollInterval: the next poll waits for the
// source's clock, not for the answer.
func TestEmptyPollsArePaced(t *testing.T) {
	t.Parallel()
	rs := newRenewServer(t, http.StatusOK, 0)
	clk := testclock.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s := New(Options{Client: rs.client(t), Namespace: "runners", Clock: clk})
	s.log = logr.Discard()
	var stopped atomic.Bool
	done := make(chan error, 1)
	ctx := t.Context()
	go func() {
		done <- s.pollLoop(ctx)
		stopped.Store(true)
	}()
	for n := int32(1); n <= 3; n++ {
		waitUntil(t, "the poll is answered and the loop waits on the clock", func() bool { return rs.polls.Load() == n && clk.HasWaiters() })
		clk.Step(minPollInterval - time.Millisecond)
		if got := rs.polls.Load(); got != n {
			t.Fatalf("%d polls before minPollInterval passed, want %d", got, n)
		}
		clk.Step(time.Millisecond)
		waitUntil(t, "the next poll", func() bool { return rs.polls.Load() == n+1 })
	}
	if stopped.Load() {
		t.Errorf("the poll loop stopped: %v", <-done)
	}
}
