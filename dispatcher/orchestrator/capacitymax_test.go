package orchestrator

import "testing"

// TestCapacityMaxCountsQueuedTasks: a poll's capacity.max is every lease the
// dispatcher may hold, so the orchestrator, which re-issues no more than
// that, gives back all its lapsed leases; with Kueue a task queued in Kueue
// holds its lease too.
func TestCapacityMaxCountsQueuedTasks(t *testing.T) {
	for _, tt := range []struct {
		maxConcurrent, maxQueued int
		kueue                    bool
		want                     int
	}{
		{5, 0, false, 5},
		{5, 3, false, 5},
		{2, 10, true, 12},
	} {
		if got := capacityMax(tt.maxConcurrent, tt.maxQueued, tt.kueue); got != tt.want {
			t.Errorf("capacityMax(%d, %d, %v) = %d, want %d", tt.maxConcurrent, tt.maxQueued, tt.kueue, got, tt.want)
		}
	}
}
