package orchestrator

import (
	"context"
	"fmt"
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
	"github.com/runwarden/runwarden/internal/contract"
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
	if err := s.opts.Kube.List(ctx, &jobs, client.InNamespace(s.opts.Namespace), client.MatchingLabels{contract.LabelDispatcher: s.opts.Jobs.DispatcherID}); err != nil {
		return nil, fmt.Errorf("listing this dispatcher's jobs: %w", err)
	}
	n := 0
	var awaiting []*batchv1.Job
	for i := range jobs.Items {
		j := &jobs.Items[i]
		if job.AwaitingSecret(j) {
			if id := j.Annotations[contract.TaskID]; id != "" && j.Annotations[job.AnnotationPreflight] == "" {
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
		id := j.Annotations[contract.TaskID]
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
	id := j.Annotations[contract.TaskID]
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
	if job.AwaitingSecret(j) {
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
	if !tracked || v.id != j.Annotations[contract.TaskID] {
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
	if err := s.opts.Reader.Get(ctx, req.NamespacedName, j); err == nil && job.IsRunnerJobFor(j, v.id, s.opts.Jobs.DispatcherID) {
		// Created, not in the cache yet: its events will come.
		return reconcile.Result{RequeueAfter: time.Second}, nil
	} else if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	// Someone deleted the Job before its outcome was reported (a Job of its
	// name that is not this dispatcher's runner Job of the task was made by
	// someone else after: left alone).
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

// running notes when the runner was first seen running.
func (s *Source) running(t *task) {
	if v, first := s.leases.seenRunning(t, s.clock.Now()); first && !v.leasedAt.IsZero() {
		s.opts.Recorder.Started(v.runningAt.Sub(v.leasedAt))
	}
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
