// Package clocktest has a fake clock that tells when something starts
// waiting on it, so a test that steps the clock waits for the code under
// test to reach its timer instead of polling or sleeping.
package clocktest

import (
	"fmt"
	"time"

	"k8s.io/utils/clock"
	testclock "k8s.io/utils/clock/testing"
)

// Clock is a testclock.FakeClock that signals each timer, ticker or After
// made on it.
type Clock struct {
	*testclock.FakeClock
	// made gets a signal after each timer, ticker or After is made.
	made chan struct{}
}

var _ clock.WithTickerAndDelayedExecution = (*Clock)(nil)

// New returns a Clock at t.
func New(t time.Time) *Clock {
	return &Clock{FakeClock: testclock.NewFakeClock(t), made: make(chan struct{}, 1)}
}

func (c *Clock) signal() {
	select {
	case c.made <- struct{}{}:
	default:
	}
}

// After is FakeClock.After, signalled.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	ch := c.FakeClock.After(d)
	c.signal()
	return ch
}

// NewTimer is FakeClock.NewTimer, signalled.
func (c *Clock) NewTimer(d time.Duration) clock.Timer {
	t := c.FakeClock.NewTimer(d)
	c.signal()
	return t
}

// AfterFunc is FakeClock.AfterFunc, signalled.
func (c *Clock) AfterFunc(d time.Duration, f func()) clock.Timer {
	t := c.FakeClock.AfterFunc(d, f)
	c.signal()
	return t
}

// Tick is FakeClock.Tick, signalled.
func (c *Clock) Tick(d time.Duration) <-chan time.Time {
	ch := c.FakeClock.Tick(d)
	c.signal()
	return ch
}

// NewTicker is FakeClock.NewTicker, signalled.
func (c *Clock) NewTicker(d time.Duration) clock.Ticker {
	t := c.FakeClock.NewTicker(d)
	c.signal()
	return t
}

// WaitForWaiters waits until at least n timers or tickers wait on the
// clock, for no longer than timeout (of real time). It is woken by each
// one made, never by polling.
func (c *Clock) WaitForWaiters(n int, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for c.Waiters() < n {
		select {
		case <-c.made:
		case <-deadline.C:
			return fmt.Errorf("%d of %d timers wait on the clock after %s", c.Waiters(), n, timeout)
		}
	}
	return nil
}
