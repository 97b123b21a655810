package runner

import (
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/utils/ptr"

	"github.com/runwarden/runwarden/dispatcher/job"
)

// Capacity is the rule of what counts against --max-concurrent and, with
// Kueue, --max-queued. It is pure: a source counts its own tasks' slots
// (from its Jobs, its leases) and asks it what is free.
type Capacity struct {
	MaxConcurrent, MaxQueued int
	// Kueue: Jobs are made suspended and wait in Kueue for admission.
	Kueue bool
}

// Capacity is the capacity rule of these limits, with or without Kueue.
func (o Options) Capacity(kueue bool) Capacity {
	return Capacity{MaxConcurrent: o.MaxConcurrent, MaxQueued: o.MaxQueued, Kueue: kueue}
}

// Slot is what one task holds against the limits.
type Slot int

// The slots a task may hold.
const (
	// None: the task is over (or its Job is going).
	None Slot = iota
	// Making: the task's Job is being made. It holds the slot its Job
	// will: queued with Kueue (Jobs are made suspended), running without.
	Making
	// Queued: the task's Job waits in Kueue (or, with Kueue, for its
	// Secret). Without Kueue nothing waits, and it counts as running.
	Queued
	// Running: the task's Job runs (with Kueue: is admitted).
	Running
)

// Load is how many tasks hold each kind of slot.
type Load struct {
	// Running counts against MaxConcurrent.
	Running int
	// Queued counts, with Kueue, against MaxQueued.
	Queued int
}

// JobSlot is the slot a Job of this dispatcher's holds. A slot is free
// only once its Job can no longer run: a Job being deleted holds its slot
// until it is gone, since its pods may still run meanwhile (a foreground
// deletion, the garbage collector's when a RunnerTask is deleted so,
// keeps the Job until they are gone).
func (c Capacity) JobSlot(j *batchv1.Job) Slot {
	switch {
	case job.Finished(j):
		return None
	case c.Kueue && ptr.Deref(j.Spec.Suspend, false):
		return Queued
	default:
		return Running
	}
}

// Add is l with n more tasks holding slot s.
func (c Capacity) Add(l Load, s Slot, n int) Load {
	switch {
	case s == None:
	case c.Kueue && (s == Making || s == Queued):
		l.Queued += n
	default:
		l.Running += n
	}
	return l
}

// Free is how many more tasks may be taken: the free slots, and with Kueue
// no more than the room left in the dispatcher's share of the queue.
func (c Capacity) Free(l Load) int {
	free := max(c.MaxConcurrent-l.Running, 0)
	if c.Kueue {
		free = min(free, max(c.MaxQueued-l.Queued, 0))
	}
	return free
}

// Full says why no task may be taken at load l, or "" when one may.
func (c Capacity) Full(l Load) string {
	switch {
	case c.Kueue && l.Running >= c.MaxConcurrent:
		return fmt.Sprintf("%d of %d tasks admitted", l.Running, c.MaxConcurrent)
	case c.Kueue && l.Queued >= c.MaxQueued:
		return fmt.Sprintf("%d of %d tasks queued in Kueue", l.Queued, c.MaxQueued)
	case l.Running >= c.MaxConcurrent:
		return fmt.Sprintf("%d of %d tasks running", l.Running, c.MaxConcurrent)
	}
	return ""
}
