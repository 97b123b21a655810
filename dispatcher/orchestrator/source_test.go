package orchestrator

import (
	"fmt"
	"testing"

	"github.com/go-logr/logr"
)

// A lease of a task this process let go, delivered again, is not taken for
// a new task; nor is a lease without IDs. (Other leases start a Job and
// are covered by the e2e suite on a real API server.)
func TestTakeIgnoresEndedAndMalformedLeases(t *testing.T) {
	t.Parallel()
	s := New(Options{})
	s.log = logr.Discard()
	s.mu.Lock()
	s.endedLocked("l-1")
	s.mu.Unlock()
	s.take(t.Context(), []Lease{
		{LeaseID: "l-1", Epoch: 1, Task: Task{ID: "t-1"}},
		{LeaseID: "", Epoch: 1, Task: Task{ID: "t-2"}},
		{LeaseID: "l-3", Epoch: 1, Task: Task{ID: ""}},
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.tasks) != 0 {
		t.Errorf("tasks taken: %v", s.tasks)
	}
}

// The memory of ended leases keeps the newest maxEnded.
func TestEndedLeasesAreBounded(t *testing.T) {
	t.Parallel()
	s := New(Options{})
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range maxEnded + 10 {
		s.endedLocked(fmt.Sprintf("l-%d", i))
	}
	s.endedLocked("l-20") // already held: no second entry
	if len(s.ended) != maxEnded || len(s.endedOrder) != maxEnded {
		t.Fatalf("%d ended leases held (%d in order), want %d", len(s.ended), len(s.endedOrder), maxEnded)
	}
	for _, id := range []string{"l-0", "l-9"} {
		if _, ok := s.ended[id]; ok {
			t.Errorf("oldest lease %s still held", id)
		}
	}
	for _, id := range []string{"l-10", fmt.Sprintf("l-%d", maxEnded+9)} {
		if _, ok := s.ended[id]; !ok {
			t.Errorf("lease %s forgotten", id)
		}
	}
}
