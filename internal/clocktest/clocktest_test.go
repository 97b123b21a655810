package clocktest

import (
	"testing"
	"time"
)

func TestWaitForWaiters(t *testing.T) {
	t.Parallel()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		// make makes what waits on the clock.
		make func(c *Clock)
	}{
		{"timer", func(c *Clock) { c.NewTimer(time.Second) }},
		{"after", func(c *Clock) { c.After(time.Second) }},
		{"after func", func(c *Clock) { c.AfterFunc(time.Second, func() {}) }},
		{"ticker", func(c *Clock) { c.NewTicker(time.Second) }},
		{"tick", func(c *Clock) { c.Tick(time.Second) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := New(start)
			// Nothing waits: the wait ends at its deadline.
			if err := c.WaitForWaiters(1, time.Millisecond); err == nil {
				t.Fatal("WaitForWaiters(1) with nothing waiting: no error")
			}
			go tt.make(c)
			if err := c.WaitForWaiters(1, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			if !c.HasWaiters() {
				t.Error("WaitForWaiters returned with nothing waiting")
			}
		})
	}
}
