package orchestratortest

import (
	"crypto/rand"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/runwarden/runwarden/dispatcher/orchestrator"
)

// TaskRecord is what the server knows of a task: its leases, and what was
// reported about it.
type TaskRecord struct {
	Task orchestrator.Task

	// Queued tells whether the task waits for a lease: never leased yet, or
	// its last lease expired.
	Queued bool
	// Leased tells whether the task has a live lease: issued, not expired,
	// no final event stored.
	Leased bool
	// Epoch is the epoch of the latest lease, 0 before the first.
	Epoch int64
	// LeaseID, Holder and ExpiresAt describe the latest lease.
	LeaseID   string
	Holder    string
	ExpiresAt time.Time
	// Leases are all the leases issued for the task, oldest first.
	Leases []LeaseRecord
	// Renewals counts successful renewals.
	Renewals int
	// Requeues counts the leases of the task that expired.
	Requeues int
	// Releases counts the leases of the task handed back unused.
	Releases int

	// Cancelled is set by Server.Cancel, with CancelReason.
	Cancelled    bool
	CancelReason string
	// EndedByOrchestrator tells that the server ended the cancelled task
	// itself: no lease held it, and no dispatcher listed it as running,
	// for a lease duration (docs/protocol.md).
	EndedByOrchestrator bool

	// Events are the events stored, first arrival of each idempotency key,
	// in order.
	Events []orchestrator.Event
	// Final is the first final event stored, nil before.
	Final *orchestrator.Event
	// FinalStored counts the final events stored, that is final events
	// with distinct idempotency keys; a correct dispatcher makes it 1.
	FinalStored int
	// FinalPosts counts every event request with a final type, repeats and
	// refused ones included.
	FinalPosts int
	// EventPosts counts every event request for the task.
	EventPosts int
	// Repeats counts event requests answered from an earlier one with the
	// same idempotency key.
	Repeats int
	// RepeatConflicts counts repeats whose type differs from the stored
	// event's.
	RepeatConflicts int
	// BadKeys counts stored events whose idempotency key is not
	// "<task ID>/<type>", or "<task ID>/final" for a final event.
	BadKeys int
	// Stale counts event and log requests refused 409 stale-lease.
	Stale int
	// NotHolder counts renewals, releases, events and log chunks refused
	// 403 not-lease-holder: sent by a dispatcher that did not hold the
	// lease they name.
	NotHolder int

	// Log is the log as stored, LogFinal whether a final chunk arrived.
	Log      []byte
	LogFinal bool
	// LogPosts counts log requests for the task; LogGaps those refused
	// 409 log-gap.
	LogPosts int
	LogGaps  int
}

// Done tells whether a final event was stored for the task.
func (t TaskRecord) Done() bool { return t.Final != nil }

// LeaseRecord is one lease issued.
type LeaseRecord struct {
	LeaseID      string
	Epoch        int64
	DispatcherID string
	IssuedAt     time.Time
	// Reissued tells whether the lease was re-issued to a dispatcher that
	// listed the task in PollRequest.Running, rather than handed out from
	// the queue.
	Reissued bool
}

// PollRecord is one poll as the server answered it.
type PollRecord struct {
	DispatcherID string
	Capacity     orchestrator.Capacity
	Running      []string
	WaitSeconds  int
	// New counts leases handed out from the queue, Reissued leases
	// re-issued for Running, Duplicates duplicate deliveries; all 0 for a
	// 204.
	New        int
	Reissued   int
	Duplicates int
	// Time is when the poll was answered.
	Time time.Time
}

// task is the server's state of one task.
type task struct {
	rec TaskRecord
	// lease is the latest lease; live while rec.Leased.
	lease orchestrator.Lease
	keys  map[string]int // idempotency key -> index in rec.Events
	// unheld is when a cancelled task was last seen with no lease, zero
	// while one holds it.
	unheld time.Time
}

// dup is a lease owed again to a dispatcher's next poll.
type dup struct {
	t     *task
	lease orchestrator.Lease
}

// Add queues tasks, in order. It panics on a task without ID or with the
// ID of a task added before.
func (s *Server) Add(tasks ...orchestrator.Task) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, tk := range tasks {
		if tk.ID == "" {
			panic("orchestratortest: Add: task without ID")
		}
		if _, ok := s.tasks[tk.ID]; ok {
			panic("orchestratortest: Add: task " + tk.ID + " added twice")
		}
		t := &task{rec: TaskRecord{Task: cloneTask(tk), Queued: true}, keys: map[string]int{}}
		s.tasks[tk.ID] = t
		s.order = append(s.order, t)
		s.queue = append(s.queue, t)
	}
	s.notifyLocked()
}

// Cancel asks for the cancellation of a task: the next renewal of its lease
// answers cancel with reason. A task never leased leaves the queue for
// good, ended by the server at once; a task whose lease expired is
// re-issued only to a dispatcher that lists it in PollRequest.Running, and
// ended by the server when none has for a lease duration. Cancel panics on
// an unknown task.
func (s *Server) Cancel(taskID, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tasks[taskID]
	if !ok {
		panic("orchestratortest: Cancel: no task " + taskID)
	}
	t.rec.Cancelled = true
	t.rec.CancelReason = reason
	s.endCancelledLocked(t, s.clock.Now())
}

// Task returns a copy of the record of a task; the zero TaskRecord for an
// unknown ID.
func (s *Server) Task(id string) TaskRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tasks[id]
	if !ok {
		return TaskRecord{}
	}
	return t.rec.clone()
}

// Tasks returns copies of the records of all tasks, in the order added.
func (s *Server) Tasks() []TaskRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]TaskRecord, len(s.order))
	for i, t := range s.order {
		out[i] = t.rec.clone()
	}
	return out
}

// Done counts the tasks with a final event stored.
func (s *Server) Done() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, t := range s.order {
		if t.rec.Final != nil {
			n++
		}
	}
	return n
}

// Polls returns the polls answered so far, oldest first.
func (s *Server) Polls() []PollRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]PollRecord, len(s.polls))
	for i, p := range s.polls {
		p.Running = slices.Clone(p.Running)
		out[i] = p
	}
	return out
}

// notifyLocked wakes the held polls.
func (s *Server) notifyLocked() {
	close(s.wake)
	s.wake = make(chan struct{})
}

func (s *Server) enqueueLocked(t *task) {
	t.rec.Queued = true
	s.queue = append(s.queue, t)
	s.notifyLocked()
}

func (s *Server) dequeueLocked(t *task) {
	t.rec.Queued = false
	if i := slices.Index(s.queue, t); i >= 0 {
		s.queue = slices.Delete(s.queue, i, i+1)
	}
}

// expireLocked puts the tasks whose lease expired by now back in the queue.
func (s *Server) expireLocked(now time.Time) {
	for _, t := range s.order {
		if t.rec.Leased && !now.Before(t.lease.ExpiresAt) {
			t.rec.Leased = false
			t.rec.Requeues++
			s.stats.Requeues++
			s.enqueueLocked(t)
		}
		s.endCancelledLocked(t, now)
	}
}

// endCancelledLocked ends a cancelled task that no lease has held, and no
// dispatcher has listed as running, for a lease duration (at once if it was
// never leased): its lease response was lost, or its dispatcher stopped
// before its Job existed, so no dispatcher will ever report it. The server stores
// the final cancelled event itself (docs/protocol.md).
func (s *Server) endCancelledLocked(t *task, now time.Time) {
	if !t.rec.Cancelled || t.rec.Final != nil || t.rec.Leased {
		t.unheld = time.Time{}
		return
	}
	// A task never leased ends at once: no dispatcher can hold it.
	if t.rec.Epoch > 0 {
		if t.unheld.IsZero() {
			t.unheld = now
			return
		}
		if now.Sub(t.unheld) < s.leaseDuration() {
			return
		}
	}
	ev := orchestrator.Event{
		IdempotencyKey: t.rec.Task.ID + "/final", Epoch: t.rec.Epoch, Type: orchestrator.EventCancelled, Reason: "Cancelled",
		Message: "cancelled while no dispatcher held it: " + t.rec.CancelReason, Time: now.UTC(),
	}
	t.keys[ev.IdempotencyKey] = len(t.rec.Events)
	t.rec.Events = append(t.rec.Events, ev)
	t.rec.FinalStored++
	final := cloneEvent(ev)
	t.rec.Final = &final
	t.rec.EndedByOrchestrator = true
	s.dequeueLocked(t)
}

// nextExpiryLocked is the earliest expiry of a live lease, zero if none.
func (s *Server) nextExpiryLocked() time.Time {
	var next time.Time
	for _, t := range s.order {
		if t.rec.Leased && (next.IsZero() || t.lease.ExpiresAt.Before(next)) {
			next = t.lease.ExpiresAt
		}
	}
	return next
}

// issueLocked hands a task out as a new lease to a dispatcher.
func (s *Server) issueLocked(t *task, dispatcherID string, now time.Time, reissued bool) orchestrator.Lease {
	s.dequeueLocked(t)
	t.rec.Epoch++
	l := orchestrator.Lease{
		LeaseID:      "l-" + strings.ToLower(rand.Text()),
		Epoch:        t.rec.Epoch,
		LeaseSeconds: s.opts.LeaseSeconds,
		ExpiresAt:    now.Add(s.leaseDuration()),
		Task:         cloneTask(t.rec.Task),
	}
	t.lease = l
	t.rec.Leased = true
	t.rec.LeaseID = l.LeaseID
	t.rec.Holder = dispatcherID
	t.rec.ExpiresAt = l.ExpiresAt
	t.rec.Leases = append(t.rec.Leases, LeaseRecord{
		LeaseID: l.LeaseID, Epoch: l.Epoch, DispatcherID: dispatcherID, IssuedAt: now, Reissued: reissued,
	})
	s.byLease[l.LeaseID] = t
	s.stats.LeasesIssued++
	if reissued {
		s.stats.Reissued++
	}
	return l
}

func (r *TaskRecord) clone() TaskRecord {
	c := *r
	c.Task = cloneTask(r.Task)
	c.Leases = slices.Clone(r.Leases)
	c.Events = make([]orchestrator.Event, len(r.Events))
	for i := range r.Events {
		c.Events[i] = cloneEvent(r.Events[i])
	}
	if r.Final != nil {
		f := cloneEvent(*r.Final)
		c.Final = &f
	}
	c.Log = slices.Clone(r.Log)
	return c
}

func cloneEvent(e orchestrator.Event) orchestrator.Event {
	if e.ExitCode != nil {
		code := *e.ExitCode
		e.ExitCode = &code
	}
	return e
}

func cloneTask(t orchestrator.Task) orchestrator.Task {
	t.Command = slices.Clone(t.Command)
	t.Args = slices.Clone(t.Args)
	t.Env = slices.Clone(t.Env)
	t.SecretEnv = maps.Clone(t.SecretEnv)
	if t.ActiveDeadlineSeconds != nil {
		d := *t.ActiveDeadlineSeconds
		t.ActiveDeadlineSeconds = &d
	}
	return t
}
