package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
)

// Annotations the orchestrator source keeps on its Jobs: the Job is the
// durable record of the lease and of whether the outcome was reported.
const (
	AnnotationLeaseID      = "runwarden.dev/lease-id"
	AnnotationLeaseEpoch   = "runwarden.dev/lease-epoch"
	AnnotationLeaseSeconds = "runwarden.dev/lease-seconds"
	// AnnotationOutcome holds an outcome the dispatcher decided (a pod that
	// cannot start, a cancellation) before it stops the Job's pod, so the
	// outcome survives a restart.
	AnnotationOutcome = "runwarden.dev/outcome"
	// AnnotationReported is "true" once the orchestrator acknowledged the
	// final event.
	AnnotationReported = job.AnnotationReported
)

// Recorder counts what the source does; see package metrics. Started's
// wait runs from when the lease was taken.
type Recorder interface {
	runner.Recorder
	Leased(n int)
	RenewFailed()
	SourceError(op string)
	// Polled: the orchestrator answered a poll at t.
	Polled(t time.Time)
}

// noRecorder counts nothing: the default Recorder.
type noRecorder struct{ runner.NoRecorder }

func (noRecorder) Leased(int)         {}
func (noRecorder) RenewFailed()       {}
func (noRecorder) SourceError(string) {}
func (noRecorder) Polled(time.Time)   {}

// Options configure a Source.
type Options struct {
	// Options are the limits every source shares, with their defaults
	// (package runner): capacity, workers, timeouts, history. Workers is
	// also how many Jobs are created at once.
	runner.Options
	// Client talks to the orchestrator. Required.
	Client *Client
	// Kube reads (from the manager's label-filtered cache) and writes the
	// cluster. Required.
	Kube client.Client
	// Reader reads the API server directly, to tell a Job that is gone from
	// one the cache has not seen yet. Default: Kube.
	Reader client.Reader
	// Jobs says how Jobs are built. Required.
	Jobs job.Options
	// Observer reads Jobs' outcomes. Default: runner.NewObserver, from Kube
	// and Reader.
	Observer job.Observer
	// Namespace is where tasks run; a task naming another is refused.
	// Required.
	Namespace string
	// PollWait is how long the orchestrator may hold a poll. Default: 30s.
	PollWait time.Duration
	// Backoff paces retries of polls, lease renewals and reports (each
	// Job's reconciles that failed, whatever failed in them). Default: 1s
	// doubling to 1m.
	Backoff Backoff
	// Logs streams runner logs to the orchestrator. Default: none.
	Logs runner.LogReader
	// Recorder counts. Default: none.
	Recorder Recorder
	// Now is the clock. Default: Options.Clock's; a Now given alone is
	// Options.Clock too.
	Now func() time.Time
}

func (o *Options) setDefaults() {
	if o.Clock == nil && o.Now != nil {
		o.Clock = nowClock(o.Now)
	}
	o.Options.SetDefaults()
	if o.Now == nil {
		o.Now = o.Clock.Now
	}
	if o.PollWait <= 0 {
		o.PollWait = 30 * time.Second
	}
	if o.Recorder == nil {
		o.Recorder = noRecorder{}
	}
	if o.Reader == nil {
		o.Reader = o.Kube
	}
	if o.Observer.Client == nil {
		o.Observer = runner.NewObserver(o.Options, o.Kube, o.Reader, o.Jobs.Queueing.Kueue)
	}
}

// nowClock is a Now function as the shared options' clock.
type nowClock func() time.Time

func (f nowClock) Now() time.Time                  { return f() }
func (f nowClock) Since(t time.Time) time.Duration { return f().Sub(t) }

// task is what the source holds for one leased task.
type task struct {
	id      string
	key     types.NamespacedName
	leaseID string
	epoch   int64
	// leaseSeconds is the lease's duration; it is renewed at a third.
	leaseSeconds int
	renewAt      time.Time
	// renewing is set while a renewal of the lease is in flight.
	renewing bool
	// renewFailures counts the renewals of the lease that failed in a row;
	// it paces the next.
	renewFailures int
	// recordMu serializes writes of the lease into the Job.
	recordMu sync.Mutex
	// lost is set when the lease is gone (410) and not handed back;
	// lostAt is when.
	lost   bool
	lostAt time.Time
	// creating is set from the lease until the Job exists (or the task is
	// refused without one).
	creating bool
	// finished is set once the Job's pod no longer runs.
	finished bool
	// leasedAt is when this process took the lease, runningAt when it
	// first saw the runner run (zero when it did not: a restart).
	leasedAt, runningAt time.Time
	// queued is set, with Kueue, while the Job waits for admission (and
	// while it is made).
	queued       bool
	cancel       bool
	cancelReason string
	// sent holds the events acknowledged by this process.
	sent map[EventType]bool
	logs *logStream
}

// Source runs orchestrator tasks as Jobs.
type Source struct {
	opts     Options
	capacity runner.Capacity
	settler  runner.Settler
	log      logr.Logger
	mu       sync.Mutex
	tasks    map[string]*task // by task ID
	byJob    map[types.NamespacedName]string
	wake     chan struct{}
	trigger  chan event.GenericEvent
	slots    chan struct{}
	root     context.Context
	// ended remembers the leases of the last maxEnded tasks this process
	// let go (endedOrder, oldest first), so a late second delivery of one
	// is not taken for a new task: its Job may be gone (a cancelled task's
	// is deleted), and would be created again.
	ended      map[string]struct{}
	endedOrder []string
	// retries paces the retries of Jobs whose reconcile failed.
	retries *retryLimiter
}

// maxEnded bounds Source.ended.
const maxEnded = 4096

// New returns a Source.
func New(opts Options) *Source {
	opts.setDefaults()
	return &Source{
		opts:     opts,
		capacity: opts.Capacity(opts.Jobs.Queueing.Kueue),
		settler:  runner.Settler{Client: opts.Kube, Jobs: opts.Jobs, Options: opts.Options},
		tasks:    map[string]*task{},
		byJob:    map[types.NamespacedName]string{},
		ended:    map[string]struct{}{},
		wake:     make(chan struct{}, 1),
		trigger:  make(chan event.GenericEvent, 1024),
		slots:    make(chan struct{}, opts.Workers),
		retries:  newRetryLimiter(opts.Backoff),
	}
}

// SetupWithManager registers the Job controller and the poll and renewal
// loops with the manager.
func (s *Source) SetupWithManager(mgr ctrl.Manager) error {
	s.log = mgr.GetLogger().WithName("orchestrator")
	err := ctrl.NewControllerManagedBy(mgr).
		Named("orchestrator-task").
		WithOptions(s.controllerOptions()).
		For(&batchv1.Job{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToJob)).
		WatchesRawSource(source.Channel(s.trigger, &handler.EnqueueRequestForObject{})).
		Complete(s)
	if err != nil {
		return err
	}
	return mgr.Add(s)
}

// controllerOptions are the Job controller's: Workers reconciles at once,
// and a Job whose reconcile failed retried at the pace of Backoff.
func (s *Source) controllerOptions() controller.Options {
	return controller.Options{MaxConcurrentReconciles: s.opts.Workers, RateLimiter: s.retries}
}

func podToJob(_ context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()["batch.kubernetes.io/job-name"]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
}

// Start implements manager.Runnable: it rebuilds the in-flight set from the
// dispatcher's Jobs, then polls and renews until ctx ends. Jobs are left
// running when it returns.
func (s *Source) Start(ctx context.Context) error {
	s.mu.Lock()
	s.root = ctx
	s.mu.Unlock()
	if err := s.restore(ctx); err != nil {
		return err
	}
	// Either loop ends the source when the orchestrator refuses this
	// dispatcher; the other then stops too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	go func() { errc <- s.renewLoop(ctx) }()
	go func() { errc <- s.pollLoop(ctx) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return nil
	}
}

// restore tracks every Job of this dispatcher whose outcome is not
// reported yet, with the lease in its annotations, renewing at once.
func (s *Source) restore(ctx context.Context) error {
	var jobs batchv1.JobList
	if err := s.opts.Kube.List(ctx, &jobs, client.InNamespace(s.opts.Namespace), client.MatchingLabels{job.LabelDispatcher: s.opts.Jobs.DispatcherID}); err != nil {
		return fmt.Errorf("listing this dispatcher's jobs: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	var awaiting []*batchv1.Job
	for i := range jobs.Items {
		j := &jobs.Items[i]
		if j.DeletionTimestamp != nil {
			continue
		}
		if j.Annotations[job.AnnotationAwaitingSecret] != "" {
			awaiting = append(awaiting, j)
			continue
		}
		if j.Annotations[AnnotationReported] != "" {
			continue
		}
		t := s.adoptLocked(j)
		if t != nil {
			n++
		}
	}
	s.log.Info("restored in-flight tasks from their Jobs", "tasks", n)
	if len(awaiting) > 0 {
		go s.startOver(ctx, awaiting)
	}
	return nil
}

// startOver deletes each Job that never got its Secret (the process stopped
// between creating the Job and resuming it, see job.Create) and hands its
// lease back: the Secret's values came with the lease and are not kept
// anywhere, so the task starts again from a new lease. A Secret made for
// the Job goes with it. A lease that cannot be handed back expires on its
// own.
func (s *Source) startOver(ctx context.Context, jobs []*batchv1.Job) {
	for _, j := range jobs {
		err := s.opts.Kube.Delete(ctx, j, client.Preconditions{UID: &j.UID}, client.PropagationPolicy(metav1.DeletePropagationBackground))
		if client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
			if ctx.Err() == nil {
				s.log.Error(err, "deleting a Job that never got its Secret; its lease expires, and the task's next start deletes it", "job", j.Name)
			}
			continue
		}
		epoch, _ := strconv.ParseInt(j.Annotations[AnnotationLeaseEpoch], 10, 64)
		l := Lease{LeaseID: j.Annotations[AnnotationLeaseID], Epoch: epoch, Task: Task{ID: j.Annotations[job.AnnotationTaskID]}}
		s.log.Info("a Job never got its Secret before the dispatcher stopped; deleted it and handing its lease back", "job", j.Name, "task", l.Task.ID)
		if l.LeaseID != "" {
			s.release(ctx, l)
		}
	}
}

// adoptLocked tracks a Job's task from its annotations. s.mu is held.
func (s *Source) adoptLocked(j *batchv1.Job) *task {
	id := j.Annotations[job.AnnotationTaskID]
	if id == "" || j.Annotations[job.AnnotationPreflight] != "" {
		// Not a task's Job: the preflight's, left by a restart during it.
		return nil
	}
	if t := s.tasks[id]; t != nil {
		return t
	}
	if j.Annotations[job.AnnotationAwaitingSecret] != "" {
		// Never resumed: without its lease's Secret values it cannot run.
		// restore deletes it; if that failed, the task's next start does.
		return nil
	}
	epoch, _ := strconv.ParseInt(j.Annotations[AnnotationLeaseEpoch], 10, 64)
	secs, _ := strconv.Atoi(j.Annotations[AnnotationLeaseSeconds])
	t := &task{
		id: id, key: client.ObjectKeyFromObject(j), leaseID: j.Annotations[AnnotationLeaseID], epoch: epoch,
		leaseSeconds: secs, renewAt: s.opts.Now(), finished: job.Finished(j), sent: map[EventType]bool{},
		queued: s.opts.Jobs.Queueing.Kueue && ptr.Deref(j.Spec.Suspend, false) && j.Annotations[AnnotationOutcome] == "",
	}
	s.tasks[id] = t
	s.byJob[t.key] = id
	return t
}

// inFlightLocked is the load of the tasks held (see runner.Capacity).
// s.mu is held.
func (s *Source) inFlightLocked() (load runner.Load, lost bool) {
	for _, t := range s.tasks {
		load = s.capacity.Add(load, t.slot(), 1)
		lost = lost || t.lost
	}
	return load, lost
}

// slot is what the task holds against the limits.
func (t *task) slot() runner.Slot {
	switch {
	case t.creating:
		return runner.Making
	case t.finished:
		return runner.None
	case t.queued:
		return runner.Queued
	default:
		return runner.Running
	}
}

// freeLocked is how many leases a poll may ask for (runner.Capacity.Free).
// s.mu is held.
func (s *Source) freeLocked() (free, inFlight int, lost bool) {
	load, lost := s.inFlightLocked()
	return s.capacity.Free(load), load.Running, lost
}

func (s *Source) notify() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Source) enqueue(key types.NamespacedName) {
	select {
	case s.trigger <- event.GenericEvent{Object: &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}:
	case <-s.rootCtx().Done():
		// Stopping: the controller no longer reads the channel.
	}
}

// minPollInterval is the least time between the starts of two polls that
// came back empty.
const minPollInterval = time.Second

// pollLoop long-polls for leases while there is free capacity, backing off
// on errors. Only a fatal error (refused credentials, another protocol
// version) ends it.
func (s *Source) pollLoop(ctx context.Context) error {
	failures := 0
	for ctx.Err() == nil {
		s.mu.Lock()
		free, inFlight, lost := s.freeLocked()
		// Every task held, the ones whose Job is being created too: an
		// expired lease of any of them comes back here, never elsewhere.
		running := make([]string, 0, len(s.tasks))
		for id := range s.tasks {
			running = append(running, id)
		}
		s.mu.Unlock()
		s.opts.Recorder.Running(inFlight)
		if free == 0 && !lost {
			// Full: wait for a task to finish; look again now and then.
			select {
			case <-ctx.Done():
			case <-s.wake:
			case <-time.After(s.opts.RequeueAfter):
			}
			continue
		}
		polled := time.Now()
		leases, err := s.opts.Client.Poll(ctx, free, s.opts.MaxConcurrent, running, s.opts.PollWait)
		if err == nil {
			s.opts.Recorder.Polled(time.Now())
		}
		if err == nil && len(leases) == 0 {
			// An orchestrator (or a proxy) that answers at once instead of
			// holding the poll would be polled in a tight loop.
			select {
			case <-ctx.Done():
			case <-time.After(time.Until(polled.Add(minPollInterval))):
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if IsFatal(err) {
				return refused(err)
			}
			s.opts.Recorder.SourceError("poll")
			d := s.opts.Backoff.Delay(failures, err)
			failures++
			s.log.Error(err, "polling the orchestrator failed; retrying", "in", d.Round(time.Millisecond).String(), "failures", failures)
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
			continue
		}
		failures = 0
		s.take(ctx, leases, free)
	}
	return nil
}

// refused is the error that stops the source when the orchestrator refuses
// this dispatcher (IsFatal), in a poll or a renewal.
func refused(err error) error {
	return fmt.Errorf("the orchestrator refused this dispatcher: %w", err)
}

// take starts the tasks of new leases and updates re-issued ones. New
// leases beyond free, the capacity the poll asked for, are handed back
// unused: an orchestrator that sends more must not run this dispatcher past
// --max-concurrent.
func (s *Source) take(ctx context.Context, leases []Lease, free int) {
	now := s.opts.Now()
	var fresh []*task
	var leasesOf, extra []Lease
	s.mu.Lock()
	for _, l := range leases {
		if l.Task.ID == "" || l.LeaseID == "" {
			s.log.Error(nil, "the orchestrator sent a lease without a task or lease ID; ignored", "task", l.Task.ID, "lease", l.LeaseID)
			continue
		}
		t := s.tasks[l.Task.ID]
		if _, ok := s.ended[l.LeaseID]; ok && t == nil {
			s.log.Info("a lease of a task that has ended was delivered again; ignored", "task", l.Task.ID, "lease", l.LeaseID)
			continue
		}
		if t == nil && !l.ExpiresAt.IsZero() && now.After(l.ExpiresAt.Add(s.opts.PollWait)) {
			// Its events would be refused, and the record of its task's end
			// (keepFor) may be gone: not started. The orchestrator hands the
			// task out again if it has not ended. A clock far ahead of the
			// orchestrator's has every lease look like this.
			s.log.Info("a lease arrived expired (a late delivery, or this clock is ahead of the orchestrator's); ignored", "task", l.Task.ID, "lease", l.LeaseID, "expiresAt", l.ExpiresAt, "now", now.UTC())
			continue
		}
		switch {
		case t != nil && t.leaseID == l.LeaseID:
			// A duplicate delivery of a lease already held.
			continue
		case t != nil && l.Epoch < t.epoch:
			// A late delivery of a lease older than the one held: the task
			// was handed back since, and the orchestrator refuses the older
			// epoch's events.
			s.log.Info("a lease older than the one held was delivered; ignored", "task", l.Task.ID, "lease", l.LeaseID, "epoch", l.Epoch, "heldLease", t.leaseID, "heldEpoch", t.epoch)
			continue
		case t != nil:
			// Handed back (a new epoch) after the lease expired: carry on
			// with the Job there is.
			t.leaseID, t.epoch, t.leaseSeconds, t.lost = l.LeaseID, l.Epoch, l.LeaseSeconds, false
			t.renewAt, t.renewFailures = now.Add(renewInterval(l.LeaseSeconds)), 0
			if !t.creating {
				go s.recordLease(ctx, t)
			}
			continue
		}
		if len(fresh) >= free {
			extra = append(extra, l)
			continue
		}
		t = &task{
			id: l.Task.ID, leaseID: l.LeaseID, epoch: l.Epoch, leaseSeconds: l.LeaseSeconds,
			renewAt: now.Add(renewInterval(l.LeaseSeconds)), creating: true, queued: s.opts.Jobs.Queueing.Kueue, sent: map[EventType]bool{}, leasedAt: now,
		}
		s.tasks[t.id] = t
		fresh = append(fresh, t)
		leasesOf = append(leasesOf, l)
	}
	s.mu.Unlock()
	for _, l := range extra {
		s.log.Info("the orchestrator sent more leases than the capacity asked for; handing this one back", "task", l.Task.ID, "lease", l.LeaseID, "asked", free)
		go s.release(ctx, l)
	}
	s.opts.Recorder.Leased(len(fresh))
	for i, t := range fresh {
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		go func() {
			defer func() { <-s.slots }()
			s.start(ctx, t, leasesOf[i])
		}()
	}
}

// release hands an unused lease back. A lease that cannot be handed back
// expires on the orchestrator's side, which then hands the task out again:
// either way it is not run here.
func (s *Source) release(ctx context.Context, l Lease) {
	if err := s.opts.Client.Release(ctx, l.LeaseID, l.Epoch); err != nil && ctx.Err() == nil {
		s.log.Error(err, "handing a lease back failed; it expires on its own", "task", l.Task.ID, "lease", l.LeaseID)
	}
}

// leaseDuration is a lease's duration; an orchestrator that sends none
// means 60 s.
func leaseDuration(leaseSeconds int) time.Duration {
	if leaseSeconds <= 0 {
		leaseSeconds = 60
	}
	return time.Duration(leaseSeconds) * time.Second
}

func renewInterval(leaseSeconds int) time.Duration {
	return leaseDuration(leaseSeconds) / 3
}

// recordLease writes the task's current lease into its Job's annotations.
// Writes for one task are serialized and each writes the lease current when
// it is sent, so the last to land holds the newest lease even when the task
// is handed back twice in quick succession.
func (s *Source) recordLease(ctx context.Context, t *task) {
	t.recordMu.Lock()
	defer t.recordMu.Unlock()
	s.mu.Lock()
	l := Lease{LeaseID: t.leaseID, Epoch: t.epoch, LeaseSeconds: t.leaseSeconds}
	key := t.key
	s.mu.Unlock()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": leaseAnnotations(l)}})
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	if err := s.opts.Kube.Patch(ctx, j, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
		s.log.Error(err, "recording the re-issued lease on the Job", "job", key.Name)
	}
	s.enqueue(key)
}

func leaseAnnotations(l Lease) map[string]string {
	return map[string]string{
		AnnotationLeaseID:      l.LeaseID,
		AnnotationLeaseEpoch:   strconv.FormatInt(l.Epoch, 10),
		AnnotationLeaseSeconds: strconv.Itoa(l.LeaseSeconds),
	}
}

// leaseJob is the Job (and Secret) of a lease's task, in namespace, or
// why the task can never run: another namespace, a variable that is not a
// value, or anything job.Build refuses.
func leaseJob(l Lease, namespace string, o job.Options) (*batchv1.Job, *corev1.Secret, error) {
	jt := jobTask(l.Task, namespace)
	if jt.Namespace != namespace {
		return nil, nil, fmt.Errorf("%w: namespace %q: this dispatcher runs tasks in %q only", job.ErrInvalidTask, jt.Namespace, namespace)
	}
	if err := plainEnv(l.Task); err != nil {
		return nil, nil, err
	}
	j, secret, err := job.Build(jt, o)
	if err != nil {
		return nil, nil, err
	}
	for k, v := range leaseAnnotations(l) {
		j.Annotations[k] = v
	}
	return j, secret, nil
}

// start creates the Job of a newly leased task, or reports it refused.
func (s *Source) start(ctx context.Context, t *task, l Lease) {
	j, secret, err := leaseJob(l, s.opts.Namespace, s.opts.Jobs)
	if err != nil {
		s.refuse(ctx, t, err)
		return
	}
	key := client.ObjectKeyFromObject(j)
	if s.endedBefore(ctx, key, l) {
		s.log.Info("a lease of a task that has ended was delivered again (its Job is the record); ignored", "task", t.id, "lease", l.LeaseID, "job", key.Name)
		s.mu.Lock()
		s.forgetLocked(t)
		s.mu.Unlock()
		s.notify()
		return
	}
	s.mu.Lock()
	t.key = key
	s.byJob[key] = t.id
	s.mu.Unlock()
	for attempt := 0; ctx.Err() == nil; attempt++ {
		err := s.create(ctx, j, secret)
		if err == nil {
			break
		}
		if job.IsPermanent(err) {
			// The API server will never take this Job (say, the task's
			// resources do not validate): the task fails, the slot frees.
			s.mu.Lock()
			if s.byJob[key] == t.id {
				delete(s.byJob, key)
			}
			t.creating = false
			s.mu.Unlock()
			if errors.Is(err, job.ErrSecretTaken) || errors.Is(err, job.ErrJobTaken) {
				s.refuse(ctx, t, fmt.Errorf("%w: %w", job.ErrInvalidTask, err))
			} else {
				// err names the Job or the Secret the API server refused.
				s.refuse(ctx, t, fmt.Errorf("%w: the API server refuses it: %w", job.ErrInvalidTask, err))
			}
			return
		}
		d := s.opts.Backoff.Delay(attempt, nil)
		s.log.Error(err, "creating the task's Job failed; retrying", "task", t.id, "in", d.Round(time.Millisecond).String())
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
	s.mu.Lock()
	t.creating = false
	reissued := t.epoch != l.Epoch
	s.mu.Unlock()
	if reissued && ctx.Err() == nil {
		// Handed back while the Job was being created: the Job holds the
		// first lease.
		s.recordLease(ctx, t)
		return
	}
	s.enqueue(key)
}

// endedBefore tells whether the Job at key records that lease l ended: it
// was reported under that very lease (finish marks it, keepFor keeps it).
// The cache answers: every replica's is warm before it leads.
func (s *Source) endedBefore(ctx context.Context, key types.NamespacedName, l Lease) bool {
	var j batchv1.Job
	if err := s.opts.Kube.Get(ctx, key, &j); err != nil {
		return false
	}
	return j.Annotations[AnnotationReported] != "" && j.Annotations[AnnotationLeaseID] == l.LeaseID
}

// create makes the task's Secret and Job, or adopts the Job with this
// lease.
func (s *Source) create(ctx context.Context, j *batchv1.Job, secret *corev1.Secret) error {
	// The orchestrator handing the task out again means it has no final
	// event from the lease before: report it again if the Job says it was.
	adopt := map[string]any{
		AnnotationLeaseID: j.Annotations[AnnotationLeaseID], AnnotationLeaseEpoch: j.Annotations[AnnotationLeaseEpoch],
		AnnotationLeaseSeconds: j.Annotations[AnnotationLeaseSeconds], AnnotationReported: nil,
	}
	created, err := job.Create(ctx, s.opts.Kube, j, secret, job.CreateOptions{Adopt: adopt})
	if created {
		s.opts.Recorder.JobCreated()
	}
	return err
}

// jobTask is the task as the Job builder takes it: plain env values only
// (the protocol has no other kind), in namespace unless the task names one.
func jobTask(t Task, namespace string) job.Task {
	jt := job.Task{
		ID: t.ID, Namespace: t.Namespace, Image: t.Image, Command: t.Command, Args: t.Args,
		SecretEnv: t.SecretEnv, RepoURL: t.RepoURL, ActiveDeadlineSeconds: t.ActiveDeadlineSeconds,
		Resources: t.Resources, Queue: t.Queue, PriorityClass: t.PriorityClass,
	}
	for _, e := range t.Env {
		jt.Env = append(jt.Env, corev1.EnvVar{Name: e.Name, Value: e.Value})
	}
	if jt.Namespace == "" {
		jt.Namespace = namespace
	}
	return jt
}

// plainEnv refuses a task whose env sends a valueFrom: the protocol's
// variables carry values (a Secret's values go in secretEnv).
func plainEnv(t Task) error {
	for i, e := range t.Env {
		if len(e.ValueFrom) > 0 && string(e.ValueFrom) != "null" {
			return fmt.Errorf("%w: %w: env[%d] (%s): valueFrom is not part of the protocol; a task's variables carry values, and secret values go in secretEnv", job.ErrInvalidTask, job.ErrEnvSource, i, e.Name)
		}
	}
	return nil
}

// refuse reports a task that can never run as failed, without a Job.
func (s *Source) refuse(ctx context.Context, t *task, cause error) {
	s.log.Info("task refused", "task", t.id, "reason", cause.Error())
	e := Event{Type: EventFailed, Reason: job.ReasonRefused, Message: cause.Error()}
	for attempt := 0; ctx.Err() == nil; attempt++ {
		err := s.report(ctx, t, e)
		if err == nil || IsConflict(err) {
			break
		}
		if !IsRetryable(err) {
			// Sending it again cannot help (say, the orchestrator does not
			// know the task): the lease expires and the task is the
			// orchestrator's again.
			s.log.Error(err, "the orchestrator refused the report of a refused task; letting the task go", "task", t.id)
			break
		}
		d := s.opts.Backoff.Delay(attempt, err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
	s.opts.Recorder.Finished(job.PhaseFailed, job.ReasonRefused)
	s.mu.Lock()
	s.forgetLocked(t)
	s.mu.Unlock()
	s.notify()
}

// report sends an event with the task's idempotency key and current epoch.
func (s *Source) report(ctx context.Context, t *task, e Event) error {
	s.mu.Lock()
	e.Epoch = t.epoch
	s.mu.Unlock()
	e.IdempotencyKey = t.id + "/" + string(e.Type)
	if e.Type.Final() {
		e.IdempotencyKey = t.id + "/final"
	}
	if e.Time.IsZero() {
		e.Time = s.opts.Now().UTC()
	}
	err := s.opts.Client.Report(ctx, t.id, e)
	if err != nil {
		s.opts.Recorder.SourceError("report")
	}
	return err
}

// maxRenewals is how many lease renewals may be in flight at once.
const maxRenewals = 32

// renewTick is how often the renewal loop looks for leases due.
const renewTick = 250 * time.Millisecond

// renewals are the renewals in flight of one renewal loop.
type renewals struct {
	// sem holds a token per renewal in flight, at most maxRenewals.
	sem chan struct{}
	wg  sync.WaitGroup
	// refused receives the first refusal of this dispatcher (IsFatal).
	refused chan error
}

func newRenewals() *renewals {
	return &renewals{sem: make(chan struct{}, maxRenewals), refused: make(chan error, 1)}
}

// renewLoop renews each lease at a third of its duration and delivers
// cancellations. Only a fatal error (refused credentials, another protocol
// version) ends it: while the source is full it does not poll, and a
// renewal is where a refusal shows.
func (s *Source) renewLoop(ctx context.Context) error {
	r := newRenewals()
	defer r.wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // before the wait: the renewals in flight end
	tick := time.NewTicker(renewTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-r.refused:
			return err
		case <-tick.C:
		}
		s.renewDue(ctx, r)
	}
}

// renewDue starts the renewals due by s.opts.Now. Renewals run side by
// side, at most maxRenewals at once, and a slow one holds up no other:
// each tick starts those that are due and not in flight.
func (s *Source) renewDue(ctx context.Context, r *renewals) {
	now := s.opts.Now()
	var due []*task
	s.mu.Lock()
	for _, t := range s.tasks {
		if !t.lost && !t.renewing && t.leaseID != "" && !now.Before(t.renewAt) {
			t.renewAt = now.Add(renewInterval(t.leaseSeconds))
			t.renewing = true
			due = append(due, t)
		}
	}
	s.mu.Unlock()
	for _, t := range due {
		r.wg.Go(func() {
			defer func() {
				s.mu.Lock()
				t.renewing = false
				s.mu.Unlock()
			}()
			select {
			case r.sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-r.sem }()
			if err := s.renew(ctx, t); err != nil {
				select {
				case r.refused <- err:
				default: // another renewal's refusal is ahead
				}
			}
		})
	}
}

// renew renews a task's lease. It returns an error only when the
// orchestrator refused this dispatcher, which ends the source.
func (s *Source) renew(ctx context.Context, t *task) error {
	s.mu.Lock()
	leaseID, epoch, key, creating := t.leaseID, t.epoch, t.key, t.creating
	s.mu.Unlock()
	resp, err := s.opts.Client.Renew(ctx, leaseID, epoch)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		s.opts.Recorder.RenewFailed()
		s.opts.Recorder.SourceError("renew")
		if IsFatal(err) {
			return refused(err)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if t.leaseID != leaseID {
			return nil // re-issued meanwhile
		}
		if IsGone(err) {
			// Expired: the orchestrator hands it back to this dispatcher
			// (the task is in every poll's running list) with a new epoch.
			t.lost, t.lostAt = true, s.opts.Now()
			s.log.Info("lease gone; waiting for the orchestrator to hand the task back", "task", t.id)
			s.notify()
			return nil
		}
		// Unreachable, overloaded, or this renewal refused: back off per
		// lease as polls and reports do, honouring Retry-After, but wait no
		// longer than a third of the lease, the pace of renewals that
		// succeed. A lease is renewed a third of the way through, so when
		// that renewal fails, the next still comes while a third of the
		// lease is left: a longer wait (a Retry-After, or a delay near
		// Backoff.Max) could let the lease expire, and the task would wait
		// for the orchestrator to hand it back. Past that the orchestrator
		// gets no more renewals than when they succeed.
		d := min(s.opts.Backoff.Delay(t.renewFailures, err), renewInterval(t.leaseSeconds))
		t.renewFailures++
		t.renewAt = s.opts.Now().Add(d)
		s.log.V(1).Info("renewing the lease failed; retrying", "task", t.id, "in", d.Round(time.Millisecond).String(), "failures", t.renewFailures, "error", err.Error())
		return nil
	}
	s.mu.Lock()
	if t.leaseID == leaseID {
		t.renewFailures = 0
	}
	first := resp.Cancel && !t.cancel
	if resp.Cancel {
		t.cancel, t.cancelReason = true, resp.CancelReason
	}
	s.mu.Unlock()
	if first && !creating {
		s.enqueue(key)
	}
	return nil
}

// Reconcile implements reconcile.Reconciler for one of the dispatcher's
// Jobs: it reports the task's progress and outcome. A Job whose reconcile
// failed is retried at the pace of Backoff (see retryLimiter).
func (s *Source) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	res, err := s.reconcileJob(ctx, req)
	if err != nil {
		s.retries.failed(req, err)
	}
	return res, err
}

func (s *Source) reconcileJob(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	j := &batchv1.Job{}
	err := s.opts.Kube.Get(ctx, req.NamespacedName, j)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	s.mu.Lock()
	id, tracked := s.byJob[req.NamespacedName]
	t := s.tasks[id]
	if apierrors.IsNotFound(err) {
		creating := t != nil && t.creating
		s.mu.Unlock()
		if !tracked || t == nil || creating {
			return reconcile.Result{}, nil
		}
		if err := s.opts.Reader.Get(ctx, req.NamespacedName, j); err == nil {
			// Created, not in the cache yet: its events will come.
			return reconcile.Result{RequeueAfter: time.Second}, nil
		} else if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		// Someone deleted the Job before its outcome was reported.
		return s.finish(ctx, t, nil, job.Outcome{Phase: job.PhaseFailed, Reason: job.ReasonFailed, Message: "the Job was deleted before it finished"})
	}
	if j.Annotations[AnnotationReported] != "" {
		if t != nil && !t.creating {
			s.forgetLocked(t)
		}
		s.mu.Unlock()
		if j.Annotations[AnnotationOutcome] != "" && j.DeletionTimestamp == nil {
			// Stopped and reported: a suspended Job never finishes, so
			// neither its TTL nor the history limits would ever remove it.
			// It goes once it is no longer the record of its ended lease.
			if keep := job.KeepUntil(j).Sub(s.opts.Now()); keep > 0 {
				return reconcile.Result{RequeueAfter: keep}, nil
			}
			if err := s.opts.Kube.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
				return reconcile.Result{}, err
			}
			return reconcile.Result{}, nil
		}
		// The mark is in the cache now: prune again, so Jobs marked at
		// nearly the same moment (each prune saw only its own mark) are
		// counted together.
		return s.pruneHistory(ctx, j)
	}
	if t == nil || t.id != j.Annotations[job.AnnotationTaskID] {
		t = s.adoptLocked(j)
	}
	if t == nil || t.creating {
		s.mu.Unlock()
		return reconcile.Result{}, nil
	}
	lost, cancel, reason := t.lost, t.cancel, t.cancelReason
	s.mu.Unlock()

	out, err := s.outcome(ctx, j)
	if err != nil {
		return reconcile.Result{}, err
	}
	s.mu.Lock()
	admitted := t.queued && !out.Queued
	t.queued = out.Queued
	s.mu.Unlock()
	if admitted {
		// A slot in the queue freed: the poll may ask for more.
		s.notify()
	}
	if lost && out.Phase == "" {
		// Wait for the orchestrator to hand the lease back; the Job runs on.
		return reconcile.Result{RequeueAfter: s.opts.RequeueAfter}, nil
	}
	if lost {
		// Over, with the lease gone: most often because the final report
		// was stored but its answer lost, so the orchestrator will never
		// hand the task back. Report again: the same idempotency key is
		// answered as stored whatever the epoch, so this works also when
		// the Job records an older lease than the one the final event was
		// stored under. A stale-lease refusal means another holder has the
		// task, and this one lets go.
		return s.finish(ctx, t, j, out)
	}
	if !s.sent(t, EventJobCreated) {
		if err := s.send(ctx, t, Event{Type: EventJobCreated, JobName: j.Name}); err != nil {
			return reconcile.Result{}, err
		}
	}
	if out.Phase == "" && cancel {
		msg := "cancelled by the orchestrator"
		if reason != "" {
			msg += ": " + reason
		}
		out = job.Outcome{Phase: job.PhaseCancelled, Reason: job.ReasonCancelled, Message: msg, Stop: true}
	}
	if out.Queued {
		if !s.sent(t, EventQueued) {
			err := s.send(ctx, t, Event{Type: EventQueued, JobName: j.Name, Reason: job.ReasonQueued, Message: out.Message})
			if statusOf(err) == http.StatusBadRequest {
				// An orchestrator of protocol 1.0 knows no queued event: it
				// learns of the task again when it runs.
				s.log.Info("the orchestrator refused a queued event (protocol 1.0); not sent again", "task", t.id, "error", err.Error())
				s.mu.Lock()
				t.sent[EventQueued] = true
				s.mu.Unlock()
			} else if err != nil {
				return reconcile.Result{}, err
			}
		}
		// Admission and eviction change the Job, which is watched.
		return reconcile.Result{RequeueAfter: 6 * s.opts.RequeueAfter}, nil
	}
	if out.Running || out.Phase != "" {
		s.streamLogs(t, j)
	}
	if out.Phase == "" {
		if out.Running && !s.sent(t, EventRunning) {
			s.mu.Lock()
			if t.runningAt.IsZero() {
				t.runningAt = s.opts.Now()
				if !t.leasedAt.IsZero() {
					s.opts.Recorder.Started(t.runningAt.Sub(t.leasedAt))
				}
			}
			s.mu.Unlock()
			if err := s.send(ctx, t, Event{Type: EventRunning, JobName: j.Name}); err != nil {
				return reconcile.Result{}, err
			}
		}
		return reconcile.Result{RequeueAfter: s.opts.RequeueAfter}, nil
	}
	return s.finish(ctx, t, j, out)
}

// awaitingReissue tells whether the task's lease is gone recently enough
// that the orchestrator may still hand it back to this dispatcher: within a
// lease (a newer lease issued meanwhile expires) and a poll (the next poll
// lists the task as running), twice over.
func (s *Source) awaitingReissue(t *task) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	wait := 2 * (leaseDuration(t.leaseSeconds) + s.opts.PollWait)
	return t.lost && s.opts.Now().Before(t.lostAt.Add(wait))
}

// keepFor is how long a Job stays once its task's final event is
// acknowledged: the record that the lease ended, for a late delivery of it
// (start checks the Job). A delivery composed before the end carries an
// expiry no later than the end plus the lease's duration, and the poll that
// carries it may be held for a poll wait; take ignores a lease that arrives
// more than a poll wait past its expiry. Neither leader of several replicas
// remembers ended leases in memory alone.
func (s *Source) keepFor(t *task) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return leaseDuration(t.leaseSeconds) + s.opts.PollWait
}

func (s *Source) isLost(t *task) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return t.lost
}

func (s *Source) sent(t *task, e EventType) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return t.sent[e]
}

// send reports a non-final event once per process; the orchestrator
// de-duplicates across processes by idempotency key.
func (s *Source) send(ctx context.Context, t *task, e Event) error {
	err := s.report(ctx, t, e)
	if err != nil && !IsConflict(err) {
		return err
	}
	s.mu.Lock()
	t.sent[e.Type] = true
	s.mu.Unlock()
	return nil
}

// outcome is the outcome recorded on the Job, else the observed one.
func (s *Source) outcome(ctx context.Context, j *batchv1.Job) (job.Outcome, error) {
	if raw := j.Annotations[AnnotationOutcome]; raw != "" {
		var out job.Outcome
		if err := json.Unmarshal([]byte(raw), &out); err == nil {
			out.Stop = true
			return out, nil
		}
	}
	return s.opts.Observer.Outcome(ctx, j)
}

// finish stops the Job's pod when the outcome came before the Job's end
// (recording the outcome on the Job first), reports the outcome, marks the
// Job reported, and frees the slot.
func (s *Source) finish(ctx context.Context, t *task, j *batchv1.Job, out job.Outcome) (reconcile.Result, error) {
	s.mu.Lock()
	t.finished = true
	s.mu.Unlock()
	s.notify()
	if j != nil && out.Stop && j.Annotations[AnnotationOutcome] == "" {
		// Kueue starts a suspended Job again while its Workload stays
		// admitted: deactivate the Workload first.
		if err := job.Deactivate(ctx, s.opts.Kube, s.opts.Reader, j); err != nil {
			return reconcile.Result{}, err
		}
		// Record the outcome, then suspend the Job: its pod stops, the Job
		// stays as the record until the report is acknowledged.
		rec, _ := json.Marshal(job.Outcome{Phase: out.Phase, Reason: out.Reason, Message: out.Message, ExitCode: out.ExitCode})
		patch, _ := json.Marshal(map[string]any{
			"metadata": map[string]any{"annotations": map[string]string{AnnotationOutcome: string(rec)}},
			"spec":     map[string]any{"suspend": true},
		})
		if err := s.opts.Kube.Patch(ctx, j, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}
	if wait := s.logsPending(t); wait {
		return reconcile.Result{RequeueAfter: 500 * time.Millisecond}, nil
	}
	e := Event{Type: EventSucceeded, Reason: out.Reason, Message: out.Message, ExitCode: out.ExitCode}
	switch out.Phase {
	case job.PhaseFailed:
		e.Type = EventFailed
	case job.PhaseCancelled:
		e.Type = EventCancelled
	}
	if j != nil {
		e.JobName = j.Name
		rec, err := job.ReadRecord(ctx, s.opts.Kube, j)
		if err != nil {
			return reconcile.Result{}, err
		}
		e.Record = wireRecord(rec)
	}
	err := s.report(ctx, t, e)
	switch {
	case err == nil:
	case IsConflict(err) && j != nil && s.awaitingReissue(t):
		// The lease is gone and the orchestrator holds a newer one: most
		// often this dispatcher's own, issued in a poll whose answer was
		// lost. The orchestrator hands an expired lease back to the
		// dispatcher that lists the task as running, which this one does
		// until it lets go: letting go now would have the task handed to
		// any dispatcher once that lease expires, and run twice.
		s.log.Info("the outcome was refused as stale while the lease is gone; waiting for the orchestrator to hand it back", "task", t.id)
		return reconcile.Result{RequeueAfter: s.opts.RequeueAfter}, nil
	case IsConflict(err) && (j == nil || s.isLost(t)):
		// A stale lease, and no Job left to report from or the lease gone
		// for longer than a hand-back takes: no final event is stored under
		// the task's key (a stored one is answered as stored, whatever the
		// epoch), so another holder has the task and reports it. The Job is
		// left to that holder, unmarked; it gets its TTL so it does not stay
		// for ever if no holder ever comes back to it. (An orchestrator that
		// refuses a repeated final event with an older epoch as stale ends
		// here too, though the task is over.)
		s.log.Info("the outcome was refused as stale and the lease was not handed back; another holder has the task, and its Job is left unmarked", "task", t.id)
		if j != nil && j.Spec.TTLSecondsAfterFinished == nil {
			if err := job.GiveTTL(ctx, s.opts.Kube, j, s.opts.Jobs); err != nil {
				return reconcile.Result{}, err
			}
		}
		s.mu.Lock()
		s.forgetLocked(t)
		s.mu.Unlock()
		s.notify()
		return reconcile.Result{}, nil
	default:
		// A conflict here is a lease handed back with a new epoch that
		// this report raced with, or one held elsewhere: the retry uses the
		// current epoch, and a lease found gone stops the reports.
		return reconcile.Result{}, err
	}
	if j != nil {
		// The Job stays as the record that the task ended until no
		// delivery of its lease can come any more (see keepFor); a stopped
		// one (suspended: it never finishes, so its TTL would not remove it)
		// is deleted then by Reconcile.
		if err := s.settler.Mark(ctx, j, s.opts.Now().Add(s.keepFor(t))); err != nil {
			return reconcile.Result{}, err
		}
	}
	s.opts.Recorder.Finished(out.Phase, out.Reason)
	s.mu.Lock()
	ranFrom := t.runningAt
	s.mu.Unlock()
	if !ranFrom.IsZero() {
		s.opts.Recorder.Ran(out.Phase, s.opts.Now().Sub(ranFrom))
	}
	s.log.Info("task finished", "task", t.id, "phase", out.Phase, "reason", out.Reason)
	s.mu.Lock()
	s.forgetLocked(t)
	s.mu.Unlock()
	s.notify()
	if j == nil {
		return reconcile.Result{}, nil
	}
	return s.pruneHistory(ctx, j)
}

// pruneHistory deletes the oldest reported Jobs beyond the history limits
// in j's namespace, counting j as reported (the cache may not show its mark
// yet). A Job beyond them that is still the record of its ended lease
// (keep-until) stays: j is looked at again once the first of those may go,
// and the prune then deletes it.
func (s *Source) pruneHistory(ctx context.Context, j *batchv1.Job) (reconcile.Result, error) {
	requeue, err := s.settler.Prune(ctx, j)
	return reconcile.Result{RequeueAfter: requeue}, err
}

// forgetLocked stops tracking a task. s.mu is held.
func (s *Source) forgetLocked(t *task) {
	if t.logs != nil {
		t.logs.stop()
	}
	if s.tasks[t.id] == t {
		delete(s.tasks, t.id)
		s.endedLocked(t.leaseID)
	}
	if s.byJob[t.key] == t.id {
		delete(s.byJob, t.key)
	}
}

// endedLocked remembers the lease of a task let go. s.mu is held.
func (s *Source) endedLocked(leaseID string) {
	if leaseID == "" {
		return
	}
	if _, ok := s.ended[leaseID]; ok {
		return
	}
	if len(s.endedOrder) == maxEnded {
		delete(s.ended, s.endedOrder[0])
		s.endedOrder = s.endedOrder[1:]
	}
	s.ended[leaseID] = struct{}{}
	s.endedOrder = append(s.endedOrder, leaseID)
}

func (s *Source) rootCtx() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.root == nil {
		return context.Background()
	}
	return s.root
}
