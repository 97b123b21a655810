package preflight

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/runwarden/runwarden/internal/clocktest"
)

// withTimeout's context ends when its clock passes the timeout, not
// before, with the cause a deadline gives; cancel ends it at once and
// leaves nothing waiting on the clock.
func TestWithTimeoutEndsByTheClock(t *testing.T) {
	t.Parallel()
	clk := clocktest.New(epoch)
	ctx, cancel := withTimeout(t.Context(), clk, time.Minute)
	defer cancel()
	clk.Step(time.Minute - time.Nanosecond)
	if ctx.Err() != nil {
		t.Fatalf("ended %v before the clock passed the timeout", ctx.Err())
	}
	clk.Step(time.Nanosecond)
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("not ended 10 s after the clock passed the timeout")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, context.DeadlineExceeded) {
		t.Errorf("cause %v, want context.DeadlineExceeded", cause)
	}

	ctx, cancel = withTimeout(t.Context(), clk, time.Minute)
	cancel()
	if ctx.Err() == nil || clk.HasWaiters() {
		t.Errorf("after cancel: error %v, %d timers waiting; want it ended and none", ctx.Err(), clk.Waiters())
	}
}

// poll looks at once, then each time the clock passes the interval, until
// the look says done or fails, or its context ends.
func TestPollLooksEveryIntervalOfTheClock(t *testing.T) {
	t.Parallel()
	clk := clocktest.New(epoch)
	looks := 0
	type result struct {
		done bool
		err  error
	}
	got := make(chan result, 1)
	go func() {
		done, err := poll(t.Context(), clk, time.Second, func() (bool, error) {
			looks++
			return looks == 3, nil
		})
		got <- result{done, err}
	}()
	for range 2 {
		if err := clk.WaitForWaiters(1, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		clk.Step(time.Second)
	}
	if r := <-got; !r.done || r.err != nil || looks != 3 {
		t.Errorf("poll: %v, %v after %d looks; want done after 3", r.done, r.err, looks)
	}

	failed := errors.New("refused")
	if done, err := poll(t.Context(), clk, time.Second, func() (bool, error) { return false, failed }); done || !errors.Is(err, failed) {
		t.Errorf("poll of a failing look: %v, %v; want its error at once", done, err)
	}
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	if done, err := poll(ended, clk, time.Second, func() (bool, error) { return false, nil }); done || err != nil {
		t.Errorf("poll with its context ended: %v, %v; want not done, no error", done, err)
	}
}
