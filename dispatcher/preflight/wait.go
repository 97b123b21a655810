package preflight

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// poll calls look at once, then every interval of clk, until look reports
// done or fails, or ctx ends. It returns whether look reported done, and
// look's error. A look that would come as ctx ends is not made.
func poll(ctx context.Context, clk clock.Clock, interval time.Duration, look func() (bool, error)) (bool, error) {
	for {
		if done, err := look(); done || err != nil {
			return done, err
		}
		t := clk.NewTimer(interval)
		select {
		case <-ctx.Done():
		case <-t.C():
		}
		t.Stop()
		if ctx.Err() != nil {
			return false, nil
		}
	}
}

// withTimeout is context.WithTimeout on clk: the context it returns ends
// once clk has passed d, with context.DeadlineExceeded as its cause (what
// net/http and the API client report), or when ctx ends or cancel is
// called. Once cancel returns, nothing waits on clk for it.
func withTimeout(ctx context.Context, clk clock.WithDelayedExecution, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := clk.AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
	return ctx, func() {
		t.Stop()
		cancel(nil)
	}
}
