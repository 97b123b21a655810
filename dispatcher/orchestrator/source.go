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
	"k8s.io/utils/clock"
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
	// one the cache has not seen yet, and what is not in the cache (Warning
	// events, Kueue Workloads: see runner.NewObserver). Default: Kube.
	Reader client.Reader
	// Jobs says how Jobs are built. Required.
	Jobs job.Options
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
}

func (o *Options) setDefaults() {
	o.SetDefaults()
	if o.PollWait <= 0 {
		o.PollWait = 30 * time.Second
	}
	if o.Recorder == nil {
		o.Recorder = noRecorder{}
	}
	if o.Reader == nil {
		o.Reader = o.Kube
	}
}

// Source runs orchestrator tasks as Jobs.
type Source struct {
	opts     Options
	clock    clock.WithTicker
	settler  runner.Settler
	observer job.Observer
	log      logr.Logger
	leases   *leaseTable
	trigger  chan event.GenericEvent
	slots    chan struct{}
	// goroutines are the ones Start started, directly or not; it waits for
	// them before it returns.
	goroutines sync.WaitGroup
	// streams carries the log streams to start to Start, which runs them.
	streams chan func(context.Context)
	// stopped is closed when Start returns.
	stopped chan struct{}
	// retries paces the retries of Jobs whose reconcile failed.
	retries *retryLimiter
}

// New returns a Source.
func New(opts Options) *Source {
	opts.setDefaults()
	return &Source{
		opts:     opts,
		clock:    opts.Clock,
		settler:  runner.Settler{Client: opts.Kube, Jobs: opts.Jobs, Options: opts.Options},
		observer: runner.NewObserver(opts.Options, opts.Kube, opts.Reader, opts.Jobs.Queueing.Kueue),
		leases:   newLeaseTable(opts.Jobs.Queueing.Kueue),
		trigger:  make(chan event.GenericEvent, 1024),
		slots:    make(chan struct{}, opts.Workers),
		streams:  make(chan func(context.Context)),
		stopped:  make(chan struct{}),
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
// running when it returns; every goroutine it started has ended.
func (s *Source) Start(ctx context.Context) error {
	defer close(s.stopped)
	awaiting, err := s.restore(ctx)
	if err != nil {
		return err
	}
	// Either loop ends the source when the orchestrator refuses this
	// dispatcher; the other then stops too.
	ctx, cancel := context.WithCancel(ctx)
	defer s.goroutines.Wait()
	defer cancel() // before the wait: what runs ends
	errc := make(chan error, 2)
	s.goroutines.Go(func() { s.startOver(ctx, awaiting) })
	s.goroutines.Go(func() { errc <- s.renewLoop(ctx) })
	s.goroutines.Go(func() { errc <- s.pollLoop(ctx) })
	for {
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
			return nil
		case stream := <-s.streams:
			s.goroutines.Go(func() { stream(ctx) })
		}
	}
}

// restore tracks every Job of this dispatcher whose outcome is not
// reported yet, with the lease in its annotations, renewing at once. It
// returns the Jobs that never got their Secret, counted until startOver
// deleted them. A Job being deleted is tracked too: its pods may run until
// it is gone, so it holds its slot until then, when its task is reported
// (the Job was deleted before it finished).
func (s *Source) restore(ctx context.Context) ([]*batchv1.Job, error) {
	var jobs batchv1.JobList
	if err := s.opts.Kube.List(ctx, &jobs, client.InNamespace(s.opts.Namespace), client.MatchingLabels{job.LabelDispatcher: s.opts.Jobs.DispatcherID}); err != nil {
		return nil, fmt.Errorf("listing this dispatcher's jobs: %w", err)
	}
	n := 0
	var awaiting []*batchv1.Job
	for i := range jobs.Items {
		j := &jobs.Items[i]
		if awaitingSecret(j) {
			if id := j.Annotations[job.AnnotationTaskID]; id != "" && j.Annotations[job.AnnotationPreflight] == "" {
				// Until it is deleted it is a Job of this dispatcher's
				// that could run: it holds a slot.
				s.leases.discard(id, client.ObjectKeyFromObject(j))
			}
			awaiting = append(awaiting, j)
			continue
		}
		if reportedMark(j) {
			continue
		}
		if t, _ := s.adopt(j); t != nil {
			n++
		}
	}
	s.log.Info("restored in-flight tasks from their Jobs", "tasks", n)
	return awaiting, nil
}

// startOver deletes each Job that never got its Secret (the process stopped
// between creating the Job and resuming it, see job.Create) and hands its
// lease back: the Secret's values came with the lease and are not kept
// anywhere, so the task starts again from a new lease. A Secret made for
// the Job goes with it. A lease that cannot be handed back expires on its
// own. The Job holds a slot until it is gone.
func (s *Source) startOver(ctx context.Context, jobs []*batchv1.Job) {
	for _, j := range jobs {
		id := j.Annotations[job.AnnotationTaskID]
		err := s.opts.Kube.Delete(ctx, j, client.Preconditions{UID: &j.UID}, client.PropagationPolicy(metav1.DeletePropagationBackground))
		if client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
			if ctx.Err() == nil {
				s.log.Error(err, "deleting a Job that never got its Secret; its lease expires, and the task's next start deletes it", "job", j.Name)
			}
			continue
		}
		s.leases.discarded(id)
		epoch, _ := strconv.ParseInt(j.Annotations[AnnotationLeaseEpoch], 10, 64)
		l := Lease{LeaseID: j.Annotations[AnnotationLeaseID], Epoch: epoch, Task: Task{ID: id}}
		s.log.Info("a Job never got its Secret before the dispatcher stopped; deleted it and handing its lease back", "job", j.Name, "task", l.Task.ID)
		if l.LeaseID != "" {
			s.release(ctx, l)
		}
	}
}

// adopt tracks a Job's task from its annotations, and returns one view of
// its lease; nil for a Job that is no task's.
func (s *Source) adopt(j *batchv1.Job) (*task, lease) {
	id := j.Annotations[job.AnnotationTaskID]
	if id == "" || j.Annotations[job.AnnotationPreflight] != "" {
		// Not a task's Job: the preflight's, left by a restart during it.
		return nil, lease{}
	}
	if !job.IsNamedFor(j, id) {
		// Its task annotation was rewritten (job.IsNamedFor): the Job is
		// not the task it names, and its outcome and record are not that
		// task's.
		s.log.Info("a Job's task annotation does not match its name; not taken for that task's", "job", j.Name, "task", id)
		return nil, lease{}
	}
	if t, l, ok := s.leases.held(id); ok {
		return t, l
	}
	if awaitingSecret(j) {
		// Never resumed: without its lease's Secret values it cannot run.
		// restore deletes it; if that failed, the task's next start does.
		return nil, lease{}
	}
	epoch, _ := strconv.ParseInt(j.Annotations[AnnotationLeaseEpoch], 10, 64)
	secs, _ := strconv.Atoi(j.Annotations[AnnotationLeaseSeconds])
	return s.leases.adopt(adoption{
		id: id, key: client.ObjectKeyFromObject(j), leaseID: j.Annotations[AnnotationLeaseID], epoch: epoch, seconds: secs,
		// Ended, or stopped with its outcome recorded: it no longer runs.
		ended:     job.Finished(j) || stoppedOutcome(j),
		suspended: ptr.Deref(j.Spec.Suspend, false),
	}, s.clock.Now())
}

// enqueue has the Job at key reconciled, unless ctx ends first (the
// controller no longer reads the channel once stopping).
func (s *Source) enqueue(ctx context.Context, key types.NamespacedName) {
	select {
	case s.trigger <- event.GenericEvent{Object: &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}:
	case <-ctx.Done():
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
		free, inFlight, lost, held := s.leases.capacity(s.opts.MaxConcurrent, s.opts.MaxQueued)
		s.opts.Recorder.Running(inFlight)
		if free == 0 && !lost {
			// Full: wait for a task to finish; look again now and then.
			select {
			case <-ctx.Done():
			case <-s.leases.freed():
			case <-s.clock.After(s.opts.RequeueAfter):
			}
			continue
		}
		polled := s.clock.Now()
		leases, err := s.opts.Client.Poll(ctx, free, capacityMax(s.opts.MaxConcurrent, s.opts.MaxQueued, s.leases.kueue), held, s.opts.PollWait)
		if err == nil {
			s.opts.Recorder.Polled(s.clock.Now())
		}
		if err == nil && len(leases) == 0 {
			// An orchestrator (or a proxy) that answers at once instead of
			// holding the poll would be polled in a tight loop.
			s.wait(ctx, polled.Add(minPollInterval).Sub(s.clock.Now()))
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
			s.wait(ctx, d)
			continue
		}
		failures = 0
		s.take(ctx, leases, free)
	}
	return nil
}

// wait waits d on the source's clock, or until ctx ends.
func (s *Source) wait(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := s.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C():
	}
}

// refused is the error that stops the source when the orchestrator refuses
// this dispatcher (IsFatal), in a poll or a renewal.
func refused(err error) error {
	return fmt.Errorf("the orchestrator refused this dispatcher: %w", err)
}

// take starts the tasks of new leases and updates re-issued ones. New
// leases beyond free, the capacity the poll asked for, are handed back
// unused: an orchestrator that sends more must not run this dispatcher past
// --max-concurrent. What it starts is among s.goroutines.
func (s *Source) take(ctx context.Context, leases []Lease, free int) {
	now := s.clock.Now()
	var fresh []*task
	var leasesOf, extra []Lease
	for _, l := range leases {
		t, d, held, record := s.leases.take(l, now, s.opts.PollWait, len(fresh) < free)
		switch d {
		case deliveredMalformed:
			s.log.Error(nil, "the orchestrator sent a lease without a task or lease ID; ignored", "task", l.Task.ID, "lease", l.LeaseID)
		case deliveredEnded:
			s.log.Info("a lease of a task that has ended was delivered again; ignored", "task", l.Task.ID, "lease", l.LeaseID)
		case deliveredExpired:
			// Its events would be refused, and the record of its task's end
			// (keepFor) may be gone: not started. The orchestrator hands the
			// task out again if it has not ended. A clock far ahead of the
			// orchestrator's has every lease look like this.
			s.log.Info("a lease arrived expired (a late delivery, or this clock is ahead of the orchestrator's); ignored", "task", l.Task.ID, "lease", l.LeaseID, "expiresAt", l.ExpiresAt, "now", now.UTC())
		case deliveredDuplicate:
			// A duplicate delivery of a lease already held.
		case deliveredOlder:
			// A late delivery of a lease older than the one held: the task
			// was handed back since, and the orchestrator refuses the older
			// epoch's events.
			s.log.Info("a lease older than the one held was delivered; ignored", "task", l.Task.ID, "lease", l.LeaseID, "epoch", l.Epoch, "heldLease", held.leaseID, "heldEpoch", held.epoch)
		case deliveredReissued:
			// Handed back (a new epoch) after the lease expired: carry on
			// with the Job there is.
			if record {
				s.goroutines.Go(func() { s.recordLease(ctx, t) })
			}
		case deliveredBeyond:
			extra = append(extra, l)
		case deliveredFresh:
			fresh = append(fresh, t)
			leasesOf = append(leasesOf, l)
		}
	}
	for _, l := range extra {
		s.log.Info("the orchestrator sent more leases than the capacity asked for; handing this one back", "task", l.Task.ID, "lease", l.LeaseID, "asked", free)
		s.goroutines.Go(func() { s.release(ctx, l) })
	}
	s.opts.Recorder.Leased(len(fresh))
	for i, t := range fresh {
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		s.goroutines.Go(func() {
			defer func() { <-s.slots }()
			s.start(ctx, t, leasesOf[i])
		})
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

// recordLease writes the task's current lease into its Job's annotations,
// if no write is in flight for the task (that one writes it next). Writes
// for one task go one at a time, each writing the lease current when it is
// sent, until the last holds the newest lease: the task may be handed back
// twice in quick succession.
func (s *Source) recordLease(ctx context.Context, t *task) {
	for again := true; again; {
		v, _ := s.leases.view(t)
		l := Lease{LeaseID: v.leaseID, Epoch: v.epoch, LeaseSeconds: v.seconds}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": leaseAnnotations(l)}})
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: v.key.Namespace, Name: v.key.Name}}
		if err := s.opts.Kube.Patch(ctx, j, client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
			s.log.Error(err, "recording the re-issued lease on the Job", "job", v.key.Name)
		}
		again = s.leases.recorded(t, v.epoch) && ctx.Err() == nil
		s.enqueue(ctx, v.key)
	}
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
		s.leases.forget(t)
		return
	}
	s.leases.bind(t, key)
	for attempt := 0; ctx.Err() == nil; attempt++ {
		err := s.create(ctx, j, secret)
		if err == nil {
			break
		}
		if job.IsPermanent(err) {
			// The API server will never take this Job (say, the task's
			// resources do not validate): the task fails, the slot frees.
			s.leases.unbind(t)
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
		s.wait(ctx, d)
	}
	if ctx.Err() != nil {
		return
	}
	v := s.leases.created(t)
	if v.epoch != l.Epoch && s.leases.record(t) {
		// Handed back while the Job was being created: the Job holds the
		// first lease.
		s.recordLease(ctx, t)
		return
	}
	s.enqueue(ctx, key)
}

// endedBefore tells whether the Job at key records that lease l ended: it
// was reported under that very lease (finish marks it, keepFor keeps it).
// The cache answers: every replica's is warm before it leads.
func (s *Source) endedBefore(ctx context.Context, key types.NamespacedName, l Lease) bool {
	var j batchv1.Job
	if err := s.opts.Kube.Get(ctx, key, &j); err != nil {
		return false
	}
	return reportedMark(&j) && j.Annotations[AnnotationLeaseID] == l.LeaseID
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
	created, err := job.Create(ctx, s.opts.Kube, j, secret, job.CreateOptions{Adopt: adopt, SecretWait: s.opts.SecretGCWait})
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
	id := t.id
	s.log.Info("task refused", "task", id, "reason", cause.Error())
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
			s.log.Error(err, "the orchestrator refused the report of a refused task; letting the task go", "task", id)
			break
		}
		s.wait(ctx, s.opts.Backoff.Delay(attempt, err))
	}
	s.opts.Recorder.Finished(job.PhaseFailed, job.ReasonRefused)
	s.leases.forget(t)
}

// report sends an event with the task's idempotency key and current epoch.
func (s *Source) report(ctx context.Context, t *task, e Event) error {
	v, _ := s.leases.view(t)
	e.Epoch = v.epoch
	e.IdempotencyKey = v.id + "/" + string(e.Type)
	if e.Type.Final() {
		e.IdempotencyKey = v.id + "/final"
	}
	if e.Time.IsZero() {
		e.Time = s.clock.Now().UTC()
	}
	err := s.opts.Client.Report(ctx, v.id, e)
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
	tick := s.clock.NewTicker(renewTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-r.refused:
			return err
		case <-tick.C():
		}
		s.renewDue(ctx, r)
	}
}

// renewDue starts the renewals due by the source's clock. Renewals run
// side by side, at most maxRenewals at once, and a slow one holds up no
// other: each tick starts those that are due and not in flight.
func (s *Source) renewDue(ctx context.Context, r *renewals) {
	for _, t := range s.leases.due(s.clock.Now()) {
		r.wg.Go(func() {
			defer s.leases.renewed(t)
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
	v, _ := s.leases.view(t)
	resp, err := s.opts.Client.Renew(ctx, v.leaseID, v.epoch)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		s.opts.Recorder.RenewFailed()
		s.opts.Recorder.SourceError("renew")
		if IsFatal(err) {
			return refused(err)
		}
		s.renewFailed(t, v.leaseID, err)
		return nil
	}
	s.leases.extended(t, v.leaseID)
	if resp.Cancel && s.leases.cancelled(t, resp.CancelReason) && !v.creating() {
		// The Job's reconcile stops it; a Job being created is stopped
		// once it exists.
		s.enqueue(ctx, v.key)
	}
	return nil
}

// renewFailed takes in a renewal of lease leaseID that failed with err: a
// lease gone waits to be handed back, another failure paces the next try.
func (s *Source) renewFailed(t *task, leaseID string, err error) {
	now := s.clock.Now()
	if IsGone(err) {
		// Expired: the orchestrator hands it back to this dispatcher (the
		// task is in every poll's running list) with a new epoch.
		if v, ok := s.leases.gone(t, leaseID, now); ok {
			s.log.Info("lease gone; waiting for the orchestrator to hand the task back", "task", v.id)
		}
		return
	}
	// Unreachable, overloaded, or this renewal refused: back off per lease
	// as polls and reports do, honouring Retry-After, within the pace the
	// table keeps (leaseTable.renewalFailed).
	backoff := func(failures int) time.Duration { return s.opts.Backoff.Delay(failures, err) }
	if v, d, ok := s.leases.renewalFailed(t, leaseID, now, backoff); ok {
		s.log.V(1).Info("renewing the lease failed; retrying", "task", v.id, "in", d.Round(time.Millisecond).String(), "failures", v.renewFailures, "error", err.Error())
	}
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
	t, v, tracked := s.leases.lookup(req.NamespacedName)
	if apierrors.IsNotFound(err) {
		return s.jobGone(ctx, req, t, v, tracked)
	}
	if reportedMark(j) {
		if tracked && !v.creating() {
			s.leases.forget(t)
		}
		return s.reported(ctx, j)
	}
	if !tracked || v.id != j.Annotations[job.AnnotationTaskID] {
		t, v = s.adopt(j)
	}
	if t == nil || v.creating() {
		return reconcile.Result{}, nil
	}

	out, err := s.outcome(ctx, j)
	if err != nil {
		return reconcile.Result{}, err
	}
	// Kueue admitted the Job (a place in the queue frees: the poll may ask
	// for more), or evicted it; neither changes a task already there.
	if out.Queued {
		s.leases.requeued(t)
	} else {
		s.leases.admitted(t)
	}
	if v.lost() && out.Phase == "" {
		// Wait for the orchestrator to hand the lease back; the Job runs on.
		return reconcile.Result{RequeueAfter: s.opts.RequeueAfter}, nil
	}
	if v.lost() {
		// Over, with the lease gone: most often because the final report
		// was stored but its answer lost, so the orchestrator will never
		// hand the task back. Report again: the same idempotency key is
		// answered as stored whatever the epoch, so this works also when
		// the Job records an older lease than the one the final event was
		// stored under. A stale-lease refusal means another holder has the
		// task, and this one lets go.
		return s.finish(ctx, t, j, out)
	}
	if !v.sent[EventJobCreated] {
		if err := s.send(ctx, t, Event{Type: EventJobCreated, JobName: j.Name}); err != nil {
			return reconcile.Result{}, err
		}
	}
	if out.Phase == "" && v.cancel != nil {
		msg := "cancelled by the orchestrator"
		if v.cancel.reason != "" {
			msg += ": " + v.cancel.reason
		}
		out = job.Outcome{Phase: job.PhaseCancelled, Reason: job.ReasonCancelled, Message: msg, Stop: true}
	}
	if out.Queued {
		return s.queued(ctx, t, v, j, out)
	}
	if out.Running || out.Phase != "" {
		s.streamLogs(ctx, t, j)
	}
	if out.Phase == "" {
		if out.Running && !v.sent[EventRunning] {
			s.running(t)
			if err := s.send(ctx, t, Event{Type: EventRunning, JobName: j.Name}); err != nil {
				return reconcile.Result{}, err
			}
		}
		return reconcile.Result{RequeueAfter: s.opts.RequeueAfter}, nil
	}
	return s.finish(ctx, t, j, out)
}

// jobGone reconciles a Job that is not in the cache: one created but not
// seen yet, or one deleted before its outcome was reported.
func (s *Source) jobGone(ctx context.Context, req reconcile.Request, t *task, v lease, tracked bool) (reconcile.Result, error) {
	if !tracked || v.creating() {
		return reconcile.Result{}, nil
	}
	j := &batchv1.Job{}
	if err := s.opts.Reader.Get(ctx, req.NamespacedName, j); err == nil {
		// Created, not in the cache yet: its events will come.
		return reconcile.Result{RequeueAfter: time.Second}, nil
	} else if !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	// Someone deleted the Job before its outcome was reported.
	return s.finish(ctx, t, nil, job.Outcome{Phase: job.PhaseFailed, Reason: job.ReasonFailed, Message: "the Job was deleted before it finished"})
}

// reported reconciles a Job whose outcome the orchestrator acknowledged.
func (s *Source) reported(ctx context.Context, j *batchv1.Job) (reconcile.Result, error) {
	if _, stopped := recordedOutcome(j); stopped && j.DeletionTimestamp == nil {
		// Stopped and reported: a suspended Job never finishes, so
		// neither its TTL nor the history limits would ever remove it.
		// It goes once it is no longer the record of its ended lease.
		if keep := job.KeepUntil(j).Sub(s.clock.Now()); keep > 0 {
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

// queued reports a Job waiting in Kueue.
func (s *Source) queued(ctx context.Context, t *task, v lease, j *batchv1.Job, out job.Outcome) (reconcile.Result, error) {
	if !v.sent[EventQueued] {
		err := s.send(ctx, t, Event{Type: EventQueued, JobName: j.Name, Reason: job.ReasonQueued, Message: out.Message})
		if statusOf(err) == http.StatusBadRequest {
			// An orchestrator of protocol 1.0 knows no queued event: it
			// learns of the task again when it runs.
			s.log.Info("the orchestrator refused a queued event (protocol 1.0); not sent again", "task", v.id, "error", err.Error())
			s.leases.eventSent(t, EventQueued)
		} else if err != nil {
			return reconcile.Result{}, err
		}
	}
	// Admission and eviction change the Job, which is watched.
	return reconcile.Result{RequeueAfter: 6 * s.opts.RequeueAfter}, nil
}

// running notes when the runner was first seen running.
func (s *Source) running(t *task) {
	if v, first := s.leases.seenRunning(t, s.clock.Now()); first && !v.leasedAt.IsZero() {
		s.opts.Recorder.Started(v.runningAt.Sub(v.leasedAt))
	}
}

// awaitingReissue tells whether the task's lease is gone recently enough
// that the orchestrator may still hand it back to this dispatcher: within a
// lease (a newer lease issued meanwhile expires) and a poll (the next poll
// lists the task as running), twice over.
func (s *Source) awaitingReissue(v lease) bool {
	wait := 2 * (leaseDuration(v.seconds) + s.opts.PollWait)
	return v.lost() && s.clock.Now().Before(v.lostAt.Add(wait))
}

// keepFor is how long a Job stays once its task's final event is
// acknowledged: the record that the lease ended, for a late delivery of it
// (start checks the Job). A delivery composed before the end carries an
// expiry no later than the end plus the lease's duration, and the poll that
// carries it may be held for a poll wait; take ignores a lease that arrives
// more than a poll wait past its expiry. Neither leader of several replicas
// remembers ended leases in memory alone.
func (s *Source) keepFor(v lease) time.Duration {
	return leaseDuration(v.seconds) + s.opts.PollWait
}

// send reports a non-final event once per process; the orchestrator
// de-duplicates across processes by idempotency key.
func (s *Source) send(ctx context.Context, t *task, e Event) error {
	err := s.report(ctx, t, e)
	if err != nil && !IsConflict(err) {
		return err
	}
	s.leases.eventSent(t, e.Type)
	return nil
}

// outcome is the outcome recorded on the Job (stop), if it is believed
// (recordedOutcome, and with Kueue the Job's Workloads deactivated, as stop
// leaves them), else the observed one.
func (s *Source) outcome(ctx context.Context, j *batchv1.Job) (job.Outcome, error) {
	if out, ok := recordedOutcome(j); ok {
		if j.Labels[job.LabelQueueName] == "" {
			return out, nil
		}
		st, err := job.ReadQueueState(ctx, s.opts.Reader, j)
		if err != nil {
			return job.Outcome{}, err
		}
		if st.Inactive {
			return out, nil
		}
	}
	if j.Annotations[AnnotationOutcome] != "" {
		s.log.Info("the Job carries an outcome this dispatcher did not record (not stopped as stop leaves it); not believed, its outcome is observed", "job", j.Name)
	}
	return s.observer.Outcome(ctx, j)
}

// stoppedReasons are the reasons of the outcomes stop records: a task that
// failed, or was cancelled, while its Job still ran.
var stoppedReasons = map[string]bool{
	job.ReasonImagePullError: true, job.ReasonInvalidImage: true, job.ReasonContainerConfig: true, job.ReasonFailedMount: true,
	job.ReasonAdmission: true, job.ReasonUnschedulable: true, job.ReasonEvicted: true, job.ReasonPreempted: true,
	job.ReasonCancelled: true, job.ReasonSecretResolution: true, job.ReasonFailed: true,
}

// recordedOutcome is the outcome stop recorded on Job j, and whether it is
// believed. Who writes it: the dispatcher (stop), together with the Job's
// suspension, in one patch. The chart's writers policy lets no one else
// change a runner Job's runwarden.dev/ annotations, and its Jobs policy no
// one but the dispatcher and Kueue its spec; so that a deployment without
// the writers policy is not told a running task's outcome by whoever may
// patch Jobs (the task reported over while it runs, its Job then never
// stopped, and later deleted while it runs), the annotation is believed
// only as stop leaves it: on a suspended Job, a failure or a cancellation
// (stop never records a success) of one of the reasons stop records.
func recordedOutcome(j *batchv1.Job) (job.Outcome, bool) {
	raw := j.Annotations[AnnotationOutcome]
	if raw == "" || !ptr.Deref(j.Spec.Suspend, false) {
		return job.Outcome{}, false
	}
	var out job.Outcome
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		return job.Outcome{}, false
	}
	if (out.Phase != job.PhaseFailed && out.Phase != job.PhaseCancelled) || !stoppedReasons[out.Reason] {
		return job.Outcome{}, false
	}
	out.Stop, out.Running, out.Queued, out.Unread = true, false, false, false
	return out, true
}

// awaitingSecret tells whether Job j was made awaiting its Secret and never
// resumed (job.Create). Who writes the mark: the dispatcher, on a Job it
// makes suspended, and no one else under the chart's writers policy; on a
// Job that is not suspended it is not believed, or a restart would delete
// a running task's Job and hand its lease back (startOver).
func awaitingSecret(j *batchv1.Job) bool {
	return j.Annotations[job.AnnotationAwaitingSecret] != "" && ptr.Deref(j.Spec.Suspend, false)
}

// stoppedOutcome tells whether stop recorded an outcome on Job j and
// stopped it (recordedOutcome).
func stoppedOutcome(j *batchv1.Job) bool {
	_, ok := recordedOutcome(j)
	return ok
}

// reportedMark tells whether Job j carries the mark that its outcome was
// acknowledged (Settler.Mark). Who writes it: the dispatcher, on a Job that
// finished or that stop stopped; the chart's writers policy lets no one
// else. On a Job that still runs it is not believed: the task would be
// forgotten while it runs, its lease no longer renewed, and handed out
// again.
func reportedMark(j *batchv1.Job) bool {
	if j.Annotations[AnnotationReported] == "" {
		return false
	}
	_, stopped := recordedOutcome(j)
	return job.Finished(j) || stopped
}

// finish stops the Job's pod when the outcome came before the Job's end
// (recording the outcome on the Job first), frees the slot once the Job can
// no longer run, reports the outcome, and marks the Job reported.
func (s *Source) finish(ctx context.Context, t *task, j *batchv1.Job, out job.Outcome) (reconcile.Result, error) {
	if gone, err := s.stop(ctx, j, out); err != nil || gone {
		// A Job gone meanwhile: the reconcile of its deletion reports it.
		return reconcile.Result{}, err
	}
	// The Job can no longer run: its pod ended, or it is suspended with its
	// outcome recorded, or it is gone. Its slot frees.
	s.leases.finished(t)
	if wait := s.logsPending(t); wait {
		return reconcile.Result{RequeueAfter: 500 * time.Millisecond}, nil
	}
	e, err := s.finalEvent(ctx, j, out)
	if err != nil {
		return reconcile.Result{}, err
	}
	err = s.report(ctx, t, e)
	v, _ := s.leases.view(t)
	switch {
	case err == nil:
	case IsConflict(err) && j != nil && s.awaitingReissue(v):
		// The lease is gone and the orchestrator holds a newer one: most
		// often this dispatcher's own, issued in a poll whose answer was
		// lost. The orchestrator hands an expired lease back to the
		// dispatcher that lists the task as running, which this one does
		// until it lets go: letting go now would have the task handed to
		// any dispatcher once that lease expires, and run twice.
		s.log.Info("the outcome was refused as stale while the lease is gone; waiting for the orchestrator to hand it back", "task", v.id)
		return reconcile.Result{RequeueAfter: s.opts.RequeueAfter}, nil
	case IsConflict(err) && (j == nil || v.lost()):
		// A stale lease, and no Job left to report from or the lease gone
		// for longer than a hand-back takes: no final event is stored under
		// the task's key (a stored one is answered as stored, whatever the
		// epoch), so another holder has the task and reports it. The Job is
		// left to that holder, unmarked; it gets its TTL so it does not stay
		// for ever if no holder ever comes back to it. (An orchestrator that
		// refuses a repeated final event with an older epoch as stale ends
		// here too, though the task is over.)
		s.log.Info("the outcome was refused as stale and the lease was not handed back; another holder has the task, and its Job is left unmarked", "task", v.id)
		if j != nil && j.Spec.TTLSecondsAfterFinished == nil {
			if err := job.GiveTTL(ctx, s.opts.Kube, j, s.opts.Jobs); err != nil {
				return reconcile.Result{}, err
			}
		}
		s.leases.forget(t)
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
		if err := s.settler.Mark(ctx, j, s.clock.Now().Add(s.keepFor(v))); err != nil {
			return reconcile.Result{}, err
		}
	}
	s.opts.Recorder.Finished(out.Phase, out.Reason)
	if !v.runningAt.IsZero() {
		s.opts.Recorder.Ran(out.Phase, s.clock.Now().Sub(v.runningAt))
	}
	s.log.Info("task finished", "task", v.id, "phase", out.Phase, "reason", out.Reason)
	s.leases.forget(t)
	if j == nil {
		return reconcile.Result{}, nil
	}
	return s.pruneHistory(ctx, j)
}

// finalEvent is the final event of outcome out, with the record of the
// Job's run when there is a Job.
func (s *Source) finalEvent(ctx context.Context, j *batchv1.Job, out job.Outcome) (Event, error) {
	e := Event{Type: EventSucceeded, Reason: out.Reason, Message: out.Message, ExitCode: out.ExitCode}
	switch out.Phase {
	case job.PhaseFailed:
		e.Type = EventFailed
	case job.PhaseCancelled:
		e.Type = EventCancelled
	}
	if j == nil {
		return e, nil
	}
	e.JobName = j.Name
	rec, err := job.ReadRecord(ctx, s.opts.Kube, j)
	if err != nil {
		return e, err
	}
	e.Record = wireRecord(rec)
	return e, nil
}

// stop stops the Job's pod when the outcome came before the Job's end: it
// records the outcome on the Job and suspends it, in one write, so the
// outcome survives a restart and the Job stays as the record until the
// report is acknowledged. The Job of an outcome recorded already is
// suspended. gone says the Job went meanwhile.
func (s *Source) stop(ctx context.Context, j *batchv1.Job, out job.Outcome) (gone bool, err error) {
	if j == nil || !out.Stop {
		return false, nil
	}
	if _, recorded := recordedOutcome(j); recorded {
		return false, nil
	}
	// Kueue starts a suspended Job again while its Workload stays
	// admitted: deactivate the Workload first.
	if err := job.Deactivate(ctx, s.opts.Kube, s.opts.Reader, j); err != nil {
		return false, err
	}
	rec, _ := json.Marshal(job.Outcome{Phase: out.Phase, Reason: out.Reason, Message: out.Message, ExitCode: out.ExitCode})
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{AnnotationOutcome: string(rec)}},
		"spec":     map[string]any{"suspend": true},
	})
	err = s.opts.Kube.Patch(ctx, j, client.RawPatch(types.MergePatchType, patch))
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	return false, err
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
