package orchestrator

import (
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/runwarden/runwarden/dispatcher/runner"
)

// phase is where a task's Job is in its life, as the source sees it. Only
// the lease table's transitions change it (see leaseTable).
type phase uint8

const (
	// phaseCreating: from the lease until the Job exists, or until the task
	// is refused without one.
	phaseCreating phase = iota
	// phaseQueued: with Kueue, the Job waits for admission.
	phaseQueued
	// phaseRunning: the Job may run.
	phaseRunning
	// phaseFinished: the Job can no longer run (its pod ended, or its
	// outcome is recorded on it and it is suspended, or it is gone); the
	// final report may still be on its way.
	phaseFinished
	// phaseDiscarding: a Job an earlier process left awaiting its Secret,
	// being deleted (see Source.startOver); it is not the task's any more,
	// but it is counted until it is gone.
	phaseDiscarding
)

var phaseNames = [...]string{
	phaseCreating: "creating", phaseQueued: "queued", phaseRunning: "running",
	phaseFinished: "finished", phaseDiscarding: "discarding",
}

func (p phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "phase(" + strconv.Itoa(int(p)) + ")"
}

// lease is what the source knows of one leased task. The table hands out
// copies of it (views); it changes only in the table's transitions.
type lease struct {
	id      string
	key     types.NamespacedName
	leaseID string
	epoch   int64
	// seconds is the lease's duration; it is renewed at a third.
	seconds int
	renewAt time.Time
	// renewFailures counts the renewals of the lease that failed in a row;
	// it paces the next.
	renewFailures int
	phase         phase
	// lostAt is when the lease was found gone (410) and not handed back
	// yet; zero while it is held.
	lostAt time.Time
	// cancel holds the orchestrator's cancellation, once asked for.
	cancel *cancellation
	// leasedAt is when this process took the lease, runningAt when it
	// first saw the runner run (zero when it did not: a restart).
	leasedAt, runningAt time.Time
	// sent holds the events acknowledged by this process.
	sent map[EventType]bool
}

// cancellation is the orchestrator's request to cancel a task.
type cancellation struct{ reason string }

// lost tells whether the lease is gone and not handed back yet.
func (l *lease) lost() bool { return !l.lostAt.IsZero() }

// creating tells whether the task's Job is still being made (or the task
// refused without one): there is no Job to reconcile yet.
func (l *lease) creating() bool { return l.phase == phaseCreating }

// slot is what the lease holds against the limits (runner.Capacity): a
// Job being made holds what its Job will, a Job being discarded holds its
// slot until it is gone.
func (l *lease) slot() runner.Slot {
	switch l.phase {
	case phaseFinished:
		return runner.None
	case phaseCreating:
		return runner.Making
	case phaseQueued:
		return runner.Queued
	default:
		return runner.Running
	}
}

// load is what the lease takes of the source's capacity: a slot or, with
// Kueue, a place in the queue.
func (lt *leaseTable) load(t *task) runner.Load {
	return runner.Capacity{Kueue: lt.kueue}.Add(runner.Load{}, t.slot(), 1)
}

func (l lease) clone() lease {
	l.sent = maps.Clone(l.sent)
	if l.cancel != nil {
		c := *l.cancel
		l.cancel = &c
	}
	return l
}

// leaseDuration is a lease's duration; an orchestrator that sends none
// means 60 s.
func leaseDuration(leaseSeconds int) time.Duration {
	if leaseSeconds <= 0 {
		leaseSeconds = 60
	}
	return time.Duration(leaseSeconds) * time.Second
}

// renewInterval is the pace of a lease's renewals that succeed: a third of
// the lease.
func renewInterval(leaseSeconds int) time.Duration {
	return leaseDuration(leaseSeconds) / 3
}

// task is the table's entry for one leased task; the source holds it as a
// handle and reads it through the table only.
type task struct {
	lease
	// renewing is set while a renewal of the lease is in flight.
	renewing bool
	// recording is set while the lease is being written into the Job.
	recording bool
	logs      *logStream
}

// leaseTable owns the source's lease state: every read and write of it
// goes through its methods, it alone locks, and it hands out copies
// (views) of a lease, never the lease.
//
// It owns each task's state machine too. A task's phase, and the lease
// fields that change with it, change only in the transitions below, each a
// method of the table named for what happened; the source reads views and
// calls them. A transition called in a phase it does not leave from
// changes nothing, so no caller can make an illegal move (admitted,
// requeued, finished and discarded tell whether they moved the task).
//
//	from                      transition   to                   called by
//	(not held)                take         creating             Source.take: a poll's new lease, room for it
//	(not held)                adopt        queued, running,     Source.adopt (restore, reconcileJob): a Job of
//	                                       or finished          a task not held; the phase is the Job's
//	(not held)                discard      discarding           Source.restore: a Job left awaiting its Secret
//	discarding                discarded    (not held)           Source.startOver: that Job is deleted
//	discarding                take         creating (new task)  Source.take: a new lease of its task
//	creating                  created      queued (Kueue),      Source.start: the Job exists
//	                                       else running
//	queued                    admitted     running              Source.reconcileJob: Kueue admitted the Job
//	running                   requeued     queued               Source.reconcileJob: the Job waits in Kueue again
//	queued, running, finished finished     finished             Source.finish: the Job can no longer run
//	any                       forget       (not held)           Source.start, refuse, finish, reconcileJob:
//	                                                            the task is let go, its lease remembered as ended
//
// A slot or a place in the queue frees when a task leaves the phase that
// held it (runner.Capacity: creating and queued hold a place in the queue
// with Kueue and a slot without; running and discarding hold a slot;
// finished nothing), and freed then wakes the poll; so does a lease gone.
//
// The lease itself changes beside the phase, in any phase but discarding,
// which has no lease:
//
//	take (re-issued)   a new lease of a task held (a newer epoch): renewals start over, lost clears (Source.take)
//	extended           a renewal went through: renewals back on their pace (Source.renew)
//	renewalFailed      a renewal failed: the next one backs off (Source.renewFailed)
//	gone               the lease is gone (410): lost until re-issued; wakes the poll (Source.renewFailed)
//	cancelled          the orchestrator asked to cancel the task (Source.renew)
//	seenRunning        the runner was first seen running (Source.running)
//	eventSent          the orchestrator acknowledged an event (Source.send, Source.queued)
//
// and the table's own bookkeeping: bind and unbind (the Job's key), due and
// renewed (a renewal in flight), record and recorded (a write of the lease
// into the Job in flight), openLogs (the task's log stream).
type leaseTable struct {
	kueue bool
	// wake is signalled when capacity may have freed or a lease was lost.
	wake chan struct{}

	mu    sync.Mutex
	tasks map[string]*task // by task ID
	byJob map[types.NamespacedName]string
	// ended remembers the leases of the last maxEnded tasks this process
	// let go (endedOrder, oldest first), so a late second delivery of one
	// is not taken for a new task: its Job may be gone (a cancelled task's
	// is deleted), and would be created again.
	ended      map[string]struct{}
	endedOrder []string
}

// maxEnded bounds leaseTable.ended.
const maxEnded = 4096

func newLeaseTable(kueue bool) *leaseTable {
	return &leaseTable{
		kueue: kueue,
		wake:  make(chan struct{}, 1),
		tasks: map[string]*task{},
		byJob: map[types.NamespacedName]string{},
		ended: map[string]struct{}{},
	}
}

// freed is signalled when a slot or a place in the queue may have freed,
// or a lease was lost.
func (lt *leaseTable) freed() <-chan struct{} { return lt.wake }

func (lt *leaseTable) notify() {
	select {
	case lt.wake <- struct{}{}:
	default:
	}
}

// changeLocked applies one transition's change to t's lease. Whoever waits
// for capacity is woken when the change freed some or lost the lease.
func (lt *leaseTable) changeLocked(t *task, change func(*lease)) {
	before := lt.load(t)
	lost := t.lost()
	change(&t.lease)
	if after := lt.load(t); lt.tasks[t.id] == t && (after.Running < before.Running || after.Queued < before.Queued || (!lost && t.lost())) {
		lt.notify()
	}
}

// moveLocked moves t to phase to if it is in one of the phases from, and
// tells whether it was. It is the only code that changes a phase.
func (lt *leaseTable) moveLocked(t *task, to phase, from ...phase) bool {
	if !slices.Contains(from, t.phase) {
		return false
	}
	lt.changeLocked(t, func(l *lease) { l.phase = to })
	return true
}

// delivery is what take made of a lease delivered by a poll.
type delivery uint8

const (
	deliveredMalformed delivery = iota // no task or lease ID
	deliveredEnded                     // a lease of a task that has ended
	deliveredExpired                   // past its expiry by more than a poll wait
	deliveredDuplicate                 // the lease held
	deliveredOlder                     // older than the lease held
	deliveredReissued                  // a new epoch of the task held
	deliveredFresh                     // a new task, taken
	deliveredBeyond                    // a new task beyond the room asked for
)

// take decides on a lease a poll delivered at now: it takes a new task
// (creating) when there is room, carries a task held on with a lease
// handed back, and ignores the rest. It returns the task's handle and a
// view of its lease (for an older lease, the one held). A re-issued lease
// is to be written into the Job by the caller when record is set (see
// record).
func (lt *leaseTable) take(l Lease, now time.Time, pollWait time.Duration, room bool) (t *task, d delivery, held lease, record bool) {
	if l.Task.ID == "" || l.LeaseID == "" {
		return nil, deliveredMalformed, lease{}, false
	}
	lt.mu.Lock()
	defer lt.mu.Unlock()
	t = lt.tasks[l.Task.ID]
	if t != nil && t.phase == phaseDiscarding {
		// Its Job was left by an earlier process: the new lease's start
		// deletes it if startOver could not.
		lt.dropLocked(t)
		t = nil
	}
	if _, ok := lt.ended[l.LeaseID]; ok && t == nil {
		return nil, deliveredEnded, lease{}, false
	}
	if t == nil && !l.ExpiresAt.IsZero() && now.After(l.ExpiresAt.Add(pollWait)) {
		return nil, deliveredExpired, lease{}, false
	}
	switch {
	case t != nil && t.leaseID == l.LeaseID:
		return t, deliveredDuplicate, t.clone(), false
	case t != nil && l.Epoch < t.epoch:
		return t, deliveredOlder, t.clone(), false
	case t != nil:
		lt.changeLocked(t, func(h *lease) {
			h.leaseID, h.epoch, h.seconds, h.lostAt = l.LeaseID, l.Epoch, l.LeaseSeconds, time.Time{}
			h.renewAt, h.renewFailures = now.Add(renewInterval(l.LeaseSeconds)), 0
		})
		return t, deliveredReissued, t.clone(), lt.recordLocked(t)
	case !room:
		return nil, deliveredBeyond, lease{}, false
	}
	t = &task{lease: lease{
		id: l.Task.ID, leaseID: l.LeaseID, epoch: l.Epoch, seconds: l.LeaseSeconds, phase: phaseCreating,
		renewAt: now.Add(renewInterval(l.LeaseSeconds)), leasedAt: now, sent: map[EventType]bool{},
	}}
	lt.tasks[t.id] = t
	return t, deliveredFresh, t.clone(), false
}

// adoption is a task's lease as its Job records it, and what the Job says
// of its run.
type adoption struct {
	id      string
	key     types.NamespacedName
	leaseID string
	epoch   int64
	seconds int
	// ended: the Job can no longer run (it finished, or stop recorded its
	// outcome and suspended it).
	ended bool
	// suspended: the Job is suspended (with Kueue: it waits for admission).
	suspended bool
}

// adoptedPhase is the phase of a task adopted from its Job.
func (lt *leaseTable) adoptedPhase(a adoption) phase {
	switch {
	case a.ended:
		return phaseFinished
	case lt.kueue && a.suspended:
		return phaseQueued
	}
	return phaseRunning
}

// adopt tracks a Job's task from the lease in its annotations (a
// restore, or a Job the source meets without holding its task), renewing
// at now, in the phase the Job is in. It returns the task held for the
// Job's task ID if there is one.
func (lt *leaseTable) adopt(a adoption, now time.Time) (*task, lease) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if t := lt.tasks[a.id]; t != nil && t.phase != phaseDiscarding {
		return t, t.clone()
	}
	t := &task{lease: lease{
		id: a.id, key: a.key, leaseID: a.leaseID, epoch: a.epoch, seconds: a.seconds,
		renewAt: now, phase: lt.adoptedPhase(a), sent: map[EventType]bool{},
	}}
	lt.tasks[t.id] = t
	lt.byJob[t.key] = t.id
	return t, t.clone()
}

// discard counts a Job left awaiting its Secret by an earlier process
// (discarding) until discarded says it is gone.
func (lt *leaseTable) discard(id string, key types.NamespacedName) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.tasks[id] != nil {
		return
	}
	lt.tasks[id] = &task{lease: lease{id: id, key: key, phase: phaseDiscarding, sent: map[EventType]bool{}}}
}

// discarded stops counting the Job of task id that discard counted, and
// tells whether it was counted.
func (lt *leaseTable) discarded(id string) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	t := lt.tasks[id]
	if t == nil || t.phase != phaseDiscarding {
		return false
	}
	lt.dropLocked(t)
	lt.notify()
	return true
}

// created says the task's Job exists: a task being created moves to
// queued with Kueue (its Job is made suspended), else to running. It
// returns the view.
func (lt *leaseTable) created(t *task) lease {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	to := phaseRunning
	if lt.kueue {
		to = phaseQueued
	}
	lt.moveLocked(t, to, phaseCreating)
	return t.clone()
}

// admitted says Kueue admitted the task's queued Job: its place in the
// queue frees, and it holds a slot. It tells whether the task was queued.
func (lt *leaseTable) admitted(t *task) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.moveLocked(t, phaseRunning, phaseQueued)
}

// requeued says the task's running Job waits in Kueue again (evicted):
// its slot frees, and it holds a place in the queue. It tells whether the
// task was running.
func (lt *leaseTable) requeued(t *task) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.moveLocked(t, phaseQueued, phaseRunning)
}

// finished says the task's Job can no longer run: its pod ended, or it is
// suspended with its outcome recorded, or it is gone. Its slot frees; the
// final report may still be on its way. It tells whether the task moved: a
// task being created has no Job yet, and a Job being discarded is no
// task's.
func (lt *leaseTable) finished(t *task) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.moveLocked(t, phaseFinished, phaseQueued, phaseRunning, phaseFinished)
}

// forget stops tracking a task, whatever its phase, and remembers its
// lease as ended.
func (lt *leaseTable) forget(t *task) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.tasks[t.id] == t {
		lt.rememberLocked(t.leaseID)
	}
	lt.dropLocked(t)
	lt.notify()
}

// extended says the orchestrator renewed lease leaseID of the task: its
// renewals are back on their pace. A renewal of a lease the task no longer
// holds (re-issued meanwhile) changes nothing. It tells whether the lease
// was the task's.
func (lt *leaseTable) extended(t *task, leaseID string) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if t.phase == phaseDiscarding || t.leaseID != leaseID {
		return false
	}
	lt.changeLocked(t, func(l *lease) { l.renewFailures = 0 })
	return true
}

// renewalFailed says a renewal of lease leaseID of the task failed at now
// (not with 410: see gone), and paces the next one: backoff is the delay
// after that many failures in a row. It returns the view, the delay set,
// and whether the lease was the task's (not re-issued meanwhile).
//
// The delay is never longer than a third of the lease, the pace of
// renewals that succeed. A lease is renewed a third of the way through,
// so when that renewal fails, the next still comes while a third of the
// lease is left: a longer wait (a Retry-After, or a delay near
// Backoff.Max) could let the lease expire, and the task would wait for the
// orchestrator to hand it back. Past that the orchestrator gets no more
// renewals than when they succeed.
func (lt *leaseTable) renewalFailed(t *task, leaseID string, now time.Time, backoff func(failures int) time.Duration) (lease, time.Duration, bool) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if t.phase == phaseDiscarding || t.leaseID != leaseID {
		return t.clone(), 0, false
	}
	d := min(backoff(t.renewFailures), renewInterval(t.seconds))
	lt.changeLocked(t, func(l *lease) {
		l.renewFailures++
		l.renewAt = now.Add(d)
	})
	return t.clone(), d, true
}

// gone says the orchestrator answered a renewal of lease leaseID with 410
// at now: the lease expired. The task is lost until the orchestrator hands
// it back with a new epoch (take), which it does to this dispatcher, whose
// polls list the task as running; the poll is woken to ask. It returns the
// view, and whether the lease was the task's (not re-issued meanwhile).
func (lt *leaseTable) gone(t *task, leaseID string, now time.Time) (lease, bool) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if t.phase == phaseDiscarding || t.leaseID != leaseID {
		return t.clone(), false
	}
	lt.changeLocked(t, func(l *lease) { l.lostAt = now })
	return t.clone(), true
}

// cancelled says the orchestrator asked to cancel the task, for reason
// (the latest reason given is kept). It tells whether this is the first
// time it asked.
func (lt *leaseTable) cancelled(t *task, reason string) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if t.phase == phaseDiscarding {
		return false
	}
	first := t.cancel == nil
	lt.changeLocked(t, func(l *lease) { l.cancel = &cancellation{reason: reason} })
	return first
}

// seenRunning says the task's runner was seen running at now. The first
// time, it notes when, and tells so; it returns the view.
func (lt *leaseTable) seenRunning(t *task, now time.Time) (lease, bool) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	first := t.phase != phaseDiscarding && t.runningAt.IsZero()
	if first {
		lt.changeLocked(t, func(l *lease) { l.runningAt = now })
	}
	return t.clone(), first
}

// eventSent says the orchestrator acknowledged the task's event of type
// e (or answered that it needs none): this process does not send it again.
func (lt *leaseTable) eventSent(t *task, e EventType) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if t.phase == phaseDiscarding {
		return
	}
	lt.changeLocked(t, func(l *lease) { l.sent[e] = true })
}

// lookup is the task whose Job is at key, and one view of its lease.
func (lt *leaseTable) lookup(key types.NamespacedName) (*task, lease, bool) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	id, ok := lt.byJob[key]
	if !ok {
		return nil, lease{}, false
	}
	t := lt.tasks[id]
	if t == nil {
		return nil, lease{}, false
	}
	return t, t.clone(), true
}

// held is the task held for task ID id, and one view of its lease.
func (lt *leaseTable) held(id string) (*task, lease, bool) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	t := lt.tasks[id]
	if t == nil || t.phase == phaseDiscarding {
		return nil, lease{}, false
	}
	return t, t.clone(), true
}

// view is one consistent copy of a task's lease, and whether the table
// still holds the task.
func (lt *leaseTable) view(t *task) (lease, bool) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return t.clone(), lt.tasks[t.id] == t
}

// bind says the task's Job is at key.
func (lt *leaseTable) bind(t *task, key types.NamespacedName) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	t.key = key
	lt.byJob[key] = t.id
}

// unbind says the task has no Job at its key (the API server refused it).
func (lt *leaseTable) unbind(t *task) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.byJob[t.key] == t.id {
		delete(lt.byJob, t.key)
	}
}

func (lt *leaseTable) dropLocked(t *task) {
	if t.logs != nil {
		t.logs.stop()
	}
	if lt.tasks[t.id] == t {
		delete(lt.tasks, t.id)
	}
	if lt.byJob[t.key] == t.id {
		delete(lt.byJob, t.key)
	}
}

// rememberLocked remembers the lease of a task let go.
func (lt *leaseTable) rememberLocked(leaseID string) {
	if leaseID == "" {
		return
	}
	if _, ok := lt.ended[leaseID]; ok {
		return
	}
	if len(lt.endedOrder) == maxEnded {
		delete(lt.ended, lt.endedOrder[0])
		lt.endedOrder = lt.endedOrder[1:]
	}
	lt.ended[leaseID] = struct{}{}
	lt.endedOrder = append(lt.endedOrder, leaseID)
}

// hasEnded tells whether the table remembers leaseID as ended.
func (lt *leaseTable) hasEnded(leaseID string) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	_, ok := lt.ended[leaseID]
	return ok
}

// capacity is what a poll needs: how many leases it may ask for (the free
// slots, and with Kueue no more than the room left in the queue), the
// tasks in a slot, whether a lease is lost, and the IDs of the tasks held
// (the ones whose Job is being created too: an expired lease of any of
// them comes back to the poll that lists it, never elsewhere). Every Job
// the dispatcher owns that may still run is counted, a Job being deleted
// by startOver too.
func (lt *leaseTable) capacity(maxConcurrent, maxQueued int) (free, inFlight int, lost bool, held []string) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	c := runner.Capacity{MaxConcurrent: maxConcurrent, MaxQueued: maxQueued, Kueue: lt.kueue}
	var load runner.Load
	held = make([]string, 0, len(lt.tasks))
	for id, t := range lt.tasks {
		load = c.Add(load, t.slot(), 1)
		lost = lost || t.lost()
		if t.phase != phaseDiscarding {
			held = append(held, id)
		}
	}
	return c.Free(load), load.Running, lost, held
}

// due marks the leases due for renewal at now as being renewed, sets their
// next renewal a third of the lease on, and returns them. renewed ends
// each renewal.
func (lt *leaseTable) due(now time.Time) []*task {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	var due []*task
	for _, t := range lt.tasks {
		if !t.lost() && !t.renewing && t.leaseID != "" && !now.Before(t.renewAt) {
			t.renewAt = now.Add(renewInterval(t.seconds))
			t.renewing = true
			due = append(due, t)
		}
	}
	return due
}

// renewed says the renewal of t's lease that due started has ended.
func (lt *leaseTable) renewed(t *task) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	t.renewing = false
}

// record says the task's lease is to be written into its Job. It returns
// whether the caller is to write it: one write is in flight per task, and
// recorded tells its writer whether another is due.
func (lt *leaseTable) record(t *task) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.recordLocked(t)
}

func (lt *leaseTable) recordLocked(t *task) bool {
	if t.phase == phaseCreating || t.recording {
		// The Job is not there yet (start writes the lease it holds), or
		// the writer in flight writes this lease next.
		return false
	}
	t.recording = true
	return true
}

// recorded says a write of the lease of epoch landed (or failed). It
// returns whether the lease changed meanwhile and is to be written again.
func (lt *leaseTable) recorded(t *task, epoch int64) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if t.epoch != epoch && lt.tasks[t.id] == t {
		return true
	}
	t.recording = false
	return false
}

// openLogs gives the task a log stream made by open unless it has one; it
// returns the stream made, or nil.
func (lt *leaseTable) openLogs(t *task, open func() *logStream) *logStream {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if t.logs != nil || lt.tasks[t.id] != t {
		return nil
	}
	t.logs = open()
	return t.logs
}

// logStream is the task's log stream, or nil.
func (lt *leaseTable) logStream(t *task) *logStream {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return t.logs
}
