// Package kube is the dispatcher's `kube` task source: RunnerTask objects,
// each run as the one Job package job builds, with the task's status kept
// in the RunnerTask. The Job is the durable record: the reconciler keeps no
// state of its own, so a restarted dispatcher finds every Job by its
// deterministic name and carries on.
package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
)

// ReasonCapacity is the reason of a task waiting for a free slot.
const ReasonCapacity = "WaitingForCapacity"

// Options configure a Reconciler.
type Options struct {
	// Client reads and writes the cluster. Required.
	Client client.Client
	// Jobs says how Jobs are built (dispatcher ID, template, allow-lists). Required.
	Jobs job.Options
	// MaxConcurrent is how many of this dispatcher's Jobs may run at once.
	// Default: 10.
	MaxConcurrent int
	// Events reads the Warning events of Jobs and pods; they are not in the
	// label-filtered cache. Default: Client.
	Events client.Reader
	// Reader reads from the API server itself, to tell a Job the cache does
	// not show yet from one that is gone. Default: Client.
	Reader client.Reader
	// RequeueAfter is how soon a task waiting for capacity, or running, is
	// looked at again: the safety net beside the watches. Default: 5s.
	RequeueAfter time.Duration
	// UnschedulableTimeout fails a task whose pod stays unschedulable this
	// long. Default: 5m.
	UnschedulableTimeout time.Duration
	// SucceededHistory and FailedHistory are how many finished Jobs of
	// each kind are kept per namespace; older ones are deleted (their TTL
	// removes them anyway). Default: 50 and 100.
	SucceededHistory, FailedHistory int
	// Recorder counts what the reconciler does. Default: none.
	Recorder Recorder
	// Workers is how many tasks are reconciled at once. Default: 32.
	Workers int
	// Now is the clock. Default: time.Now.
	Now func() time.Time
}

// Recorder counts Jobs and outcomes; see package metrics.
type Recorder interface {
	JobCreated()
	Finished(phase, reason string)
	Running(n int)
}

type noRecorder struct{}

func (noRecorder) JobCreated()             {}
func (noRecorder) Finished(string, string) {}
func (noRecorder) Running(int)             {}

func (o *Options) setDefaults() {
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = 10
	}
	if o.RequeueAfter <= 0 {
		o.RequeueAfter = 5 * time.Second
	}
	if o.UnschedulableTimeout <= 0 {
		o.UnschedulableTimeout = 5 * time.Minute
	}
	if o.Events == nil {
		o.Events = o.Client
	}
	if o.Reader == nil {
		o.Reader = o.Client
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.SucceededHistory <= 0 {
		o.SucceededHistory = 50
	}
	if o.FailedHistory <= 0 {
		o.FailedHistory = 100
	}
	if o.Recorder == nil {
		o.Recorder = noRecorder{}
	}
	if o.Workers <= 0 {
		o.Workers = 32
	}
}

// Reconciler runs RunnerTasks as Jobs.
type Reconciler struct {
	opts     Options
	observer job.Observer
	// starting serializes the capacity check, so parallel workers never
	// start more than MaxConcurrent tasks. reserved holds the Jobs this
	// process is creating or created that the cache has not shown yet,
	// each with its RunnerTask; the creates themselves run in parallel.
	starting sync.Mutex
	reserved map[types.NamespacedName]types.NamespacedName
	// taken is the number of unfinished Jobs the cache showed at the last
	// count. Jobs only finish between counts, so taken plus the
	// reservations made since is never below the real number: the cache is
	// counted again only when that bound reaches MaxConcurrent, and before
	// the first task this process starts (counted).
	taken   int
	counted bool

	// marked holds the tasks whose Running status (with the Job's name)
	// this process wrote and the cache does not show yet, so a reconcile
	// of the stale copy (the Job's own event comes first) does not write
	// it again.
	markedMu sync.Mutex
	marked   map[types.NamespacedName]string
}

var _ reconcile.Reconciler = (*Reconciler)(nil)

// New returns a Reconciler.
func New(opts Options) *Reconciler {
	opts.setDefaults()
	return &Reconciler{opts: opts, reserved: map[types.NamespacedName]types.NamespacedName{}, marked: map[types.NamespacedName]string{}, observer: job.Observer{
		Client: opts.Client, Events: opts.Events, UnschedulableTimeout: opts.UnschedulableTimeout, Now: opts.Now,
	}}
}

// SetupWithManager watches RunnerTasks, their Jobs, and the Jobs' pods.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("runnertask").
		WithOptions(controller.Options{MaxConcurrentReconciles: r.opts.Workers}).
		For(&v1alpha1.RunnerTask{}).
		Owns(&batchv1.Job{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToTask)).
		Complete(r)
}

// podToTask maps a runner pod to its RunnerTask through the task annotation.
func podToTask(_ context.Context, o client.Object) []reconcile.Request {
	ns, name, ok := taskRef(o.GetAnnotations()[job.AnnotationTaskID])
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}}
}

// TaskID is the task ID of a RunnerTask: namespace, name and UID, so a
// RunnerTask deleted and created again is a new task with a new Job.
func TaskID(rt *v1alpha1.RunnerTask) string {
	return rt.Namespace + "/" + rt.Name + "/" + string(rt.UID)
}

func taskRef(id string) (ns, name string, ok bool) {
	parts := strings.Split(id, "/")
	if len(parts) != 3 {
		return "", "", false
	}
	return parts[0], parts[1], true
}

func terminal(p v1alpha1.Phase) bool {
	return p == v1alpha1.PhaseSucceeded || p == v1alpha1.PhaseFailed || p == v1alpha1.PhaseCancelled
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	rt := &v1alpha1.RunnerTask{}
	if err := r.opts.Client.Get(ctx, req.NamespacedName, rt); err != nil {
		if apierrors.IsNotFound(err) {
			r.forgetMarked(req.NamespacedName)
			// Deleted: its Job goes with it (it is the owner), maybe
			// before the cache ever showed it, and then no count would
			// drop the slot it holds.
			r.releaseTask(req.NamespacedName, "")
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if rt.Status.JobName != "" || terminal(rt.Status.Phase) {
		r.forgetMarked(req.NamespacedName)
	}
	name := job.Name(TaskID(rt))
	// A RunnerTask deleted and created again under the same name is a new
	// task: the slot of the old one's Job goes.
	r.releaseTask(req.NamespacedName, name)
	j := &batchv1.Job{}
	err := r.opts.Client.Get(ctx, client.ObjectKey{Namespace: rt.Namespace, Name: name}, j)
	switch {
	case apierrors.IsNotFound(err):
		j = nil
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("reading job %s: %w", name, err)
	}
	if terminal(rt.Status.Phase) {
		return reconcile.Result{}, r.settle(ctx, rt, j)
	}

	if rt.Spec.Cancel {
		if j != nil {
			// A Job that ended before the cancellation was seen (say, while
			// the dispatcher was down) keeps its real outcome.
			out, err := r.observer.Outcome(ctx, j)
			if err != nil {
				return reconcile.Result{}, err
			}
			if out.Phase != "" {
				return reconcile.Result{}, r.finish(ctx, rt, j, out)
			}
			if err := r.opts.Client.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
				return reconcile.Result{}, fmt.Errorf("stopping job %s: %w", name, err)
			}
		}
		return reconcile.Result{}, r.finish(ctx, rt, nil, job.Outcome{Phase: job.PhaseCancelled, Reason: job.ReasonCancelled, Message: "cancelled by spec.cancel"})
	}

	if j == nil && (rt.Status.JobName != "" || r.wasMarked(req.NamespacedName, name)) {
		// The task's Job was created (the status says so, or this process
		// wrote that and the cache lags): never create a second one. Ask
		// the API server whether it is only missing from the cache so far.
		live := &batchv1.Job{}
		switch err := r.opts.Reader.Get(ctx, client.ObjectKey{Namespace: rt.Namespace, Name: name}, live); {
		case err == nil && live.Labels[job.LabelDispatcher] != r.opts.Jobs.DispatcherID:
			// Made under another dispatcher ID (this one's changed): the
			// cache, which holds only Jobs of this ID, would never show it.
			log.FromContext(ctx).Info("taking over a Job made under another dispatcher ID", "job", live.Name, "was", live.Labels[job.LabelDispatcher])
			if err := job.TakeOver(ctx, r.opts.Client, live, TaskID(rt), r.opts.Jobs.DispatcherID); err != nil {
				if errors.Is(err, job.ErrJobTaken) {
					return reconcile.Result{}, r.finish(ctx, rt, nil, job.Outcome{Phase: job.PhaseFailed, Reason: job.ReasonRefused, Message: err.Error()})
				}
				return reconcile.Result{}, err
			}
			return reconcile.Result{RequeueAfter: time.Second}, nil
		case err == nil:
			return reconcile.Result{RequeueAfter: time.Second}, nil
		case !apierrors.IsNotFound(err):
			return reconcile.Result{}, fmt.Errorf("reading job %s: %w", name, err)
		}
		return reconcile.Result{}, r.finish(ctx, rt, nil, job.Outcome{
			Phase: job.PhaseFailed, Reason: job.ReasonFailed, Message: "the Job was deleted before it finished",
		})
	}
	if j == nil {
		return r.start(ctx, rt)
	}
	if j.Annotations[job.AnnotationTaskID] != TaskID(rt) {
		// Labelled as this dispatcher's but made for no task of this name
		// (the chart's admission policy lets only the dispatcher label
		// Jobs so): never taken for the task's, nor stopped.
		return reconcile.Result{}, r.finish(ctx, rt, nil, job.Outcome{Phase: job.PhaseFailed, Reason: job.ReasonRefused,
			Message: fmt.Sprintf("%v: job %s in namespace %s is not a runner Job of task %q", job.ErrJobTaken, j.Name, j.Namespace, TaskID(rt))})
	}
	if rt.Status.JobName == "" && !r.wasMarked(req.NamespacedName, j.Name) {
		// Adopted after a restart between create and status update.
		if err := r.setRunning(ctx, rt, j.Name); err != nil {
			return reconcile.Result{}, err
		}
	}
	out, err := r.observer.Outcome(ctx, j)
	if err != nil {
		return reconcile.Result{}, err
	}
	if out.Phase == "" {
		// Still running: look again even if no watched object changes
		// (admission rejections and scheduling timeouts show in events and
		// the clock, not in the Job).
		return reconcile.Result{RequeueAfter: r.opts.RequeueAfter}, nil
	}
	return reconcile.Result{}, r.finish(ctx, rt, j, out)
}

// start creates the task's Secret and Job, unless capacity is full.
func (r *Reconciler) start(ctx context.Context, rt *v1alpha1.RunnerTask) (reconcile.Result, error) {
	key := types.NamespacedName{Namespace: rt.Namespace, Name: job.Name(TaskID(rt))}
	ok, running, err := r.reserve(ctx, key, client.ObjectKeyFromObject(rt))
	if err != nil {
		return reconcile.Result{}, err
	}
	if !ok {
		if rt.Status.Phase != v1alpha1.PhasePending || rt.Status.Reason != ReasonCapacity {
			rt.Status.Phase, rt.Status.Reason = v1alpha1.PhasePending, ReasonCapacity
			rt.Status.Message = fmt.Sprintf("%d of %d tasks running", running, r.opts.MaxConcurrent)
			if err := r.opts.Client.Status().Update(ctx, rt); err != nil {
				return reconcile.Result{}, err
			}
		}
		return reconcile.Result{RequeueAfter: r.opts.RequeueAfter}, nil
	}
	t := job.Task{
		ID: TaskID(rt), Namespace: rt.Namespace, Image: rt.Spec.Image, Command: rt.Spec.Command, Args: rt.Spec.Args,
		Env: rt.Spec.Env, RepoURL: rt.Spec.RepoURL, Resources: rt.Spec.Resources, ActiveDeadlineSeconds: rt.Spec.ActiveDeadlineSeconds,
	}
	created := false
	defer func() {
		if !created {
			r.release(key)
		}
	}()
	j, secret, err := job.Build(t, r.opts.Jobs)
	if err != nil {
		// A task that can never run is finished, not retried.
		return reconcile.Result{}, r.finish(ctx, rt, nil, job.Outcome{Phase: job.PhaseFailed, Reason: job.ReasonRefused, Message: err.Error()})
	}
	if err := controllerutil.SetControllerReference(rt, j, r.opts.Client.Scheme()); err != nil {
		return reconcile.Result{}, err
	}
	made, err := job.Create(ctx, r.opts.Client, j, secret, job.CreateOptions{})
	if made {
		r.opts.Recorder.JobCreated()
	}
	created = made || err == nil // the slot stays taken once the Job exists
	if job.IsPermanent(err) {
		// The API server will never take this Job (say, the task's
		// resources do not validate): the task fails instead of retrying.
		return reconcile.Result{}, r.finish(ctx, rt, nil, job.Outcome{
			Phase: job.PhaseFailed, Reason: job.ReasonRefused, Message: "the API server refuses the task's Job: " + err.Error(),
		})
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, r.setRunning(ctx, rt, j.Name)
}

// reserve takes a slot for the Job (key) of a RunnerTask (task) about to be
// created, if one is free, and returns how many are taken.
func (r *Reconciler) reserve(ctx context.Context, key, task types.NamespacedName) (bool, int, error) {
	r.starting.Lock()
	defer r.starting.Unlock()
	if !r.counted || r.taken+len(r.reserved) >= r.opts.MaxConcurrent {
		if err := r.count(ctx); err != nil {
			return false, 0, err
		}
	}
	n := r.taken + len(r.reserved)
	if n >= r.opts.MaxConcurrent {
		return false, n, nil
	}
	r.reserved[key] = task
	r.opts.Recorder.Running(n + 1)
	return true, n + 1, nil
}

func (r *Reconciler) release(key types.NamespacedName) {
	r.starting.Lock()
	delete(r.reserved, key)
	r.starting.Unlock()
}

// releaseTask drops the reservations of a RunnerTask's Jobs other than
// keep (a Job name; empty drops them all).
func (r *Reconciler) releaseTask(task types.NamespacedName, keep string) {
	r.starting.Lock()
	defer r.starting.Unlock()
	for key, t := range r.reserved {
		if t == task && key.Name != keep {
			delete(r.reserved, key)
		}
	}
}

// count counts this dispatcher's unfinished Jobs in the cache into
// r.taken, and drops the reservations of Jobs the cache shows. r.starting
// is held.
func (r *Reconciler) count(ctx context.Context) error {
	var jobs batchv1.JobList
	// Read-only: the cache's objects are not copied.
	if err := r.opts.Client.List(ctx, &jobs, client.MatchingLabels{job.LabelDispatcher: r.opts.Jobs.DispatcherID}, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing jobs: %w", err)
	}
	n := 0
	for i := range jobs.Items {
		j := &jobs.Items[i]
		delete(r.reserved, client.ObjectKeyFromObject(j))
		if !job.Finished(j) && j.DeletionTimestamp == nil {
			n++
		}
	}
	r.taken, r.counted = n, true
	r.opts.Recorder.Running(n + len(r.reserved))
	return nil
}

// recount refreshes the count after a task finished, so the running gauge
// and the next capacity check see the freed slot. The task's own
// reservation goes too: its Job may be gone before the cache ever showed it
// (deleted, cancelled, stopped), and then no count would drop it.
func (r *Reconciler) recount(ctx context.Context, key types.NamespacedName) error {
	r.starting.Lock()
	defer r.starting.Unlock()
	delete(r.reserved, key)
	return r.count(ctx)
}

func (r *Reconciler) wasMarked(key types.NamespacedName, jobName string) bool {
	r.markedMu.Lock()
	defer r.markedMu.Unlock()
	return r.marked[key] == jobName
}

func (r *Reconciler) forgetMarked(key types.NamespacedName) {
	r.markedMu.Lock()
	delete(r.marked, key)
	r.markedMu.Unlock()
}

func (r *Reconciler) setRunning(ctx context.Context, rt *v1alpha1.RunnerTask, jobName string) error {
	rt.Status.Phase = v1alpha1.PhaseRunning
	rt.Status.JobName = jobName
	rt.Status.Reason, rt.Status.Message = "", ""
	if rt.Status.StartTime == nil {
		rt.Status.StartTime = ptr.To(metav1.Now())
	}
	if err := r.opts.Client.Status().Update(ctx, rt); err != nil {
		return err
	}
	r.markedMu.Lock()
	r.marked[client.ObjectKeyFromObject(rt)] = jobName
	r.markedMu.Unlock()
	return nil
}

// finish records a task's outcome in its status, then settles its Job. The
// status comes first: it is the record, and a Job removed before it would
// leave the outcome unknown.
func (r *Reconciler) finish(ctx context.Context, rt *v1alpha1.RunnerTask, j *batchv1.Job, out job.Outcome) error {
	rt.Status.Phase, rt.Status.Reason, rt.Status.Message, rt.Status.ExitCode = v1alpha1.Phase(out.Phase), out.Reason, out.Message, out.ExitCode
	rt.Status.CompletionTime = ptr.To(metav1.Now())
	if err := r.opts.Client.Status().Update(ctx, rt); err != nil {
		return err
	}
	// Once, when the record is written: a write that conflicts is tried
	// again and logs nothing.
	jobName := rt.Status.JobName
	if j != nil {
		jobName = j.Name
	}
	log.FromContext(ctx).Info("task finished", "job", jobName, "phase", out.Phase, "reason", out.Reason)
	r.opts.Recorder.Finished(out.Phase, out.Reason)
	if err := r.settle(ctx, rt, j); err != nil {
		return err
	}
	return r.recount(ctx, types.NamespacedName{Namespace: rt.Namespace, Name: job.Name(TaskID(rt))})
}

// settle brings the Job of a finished task in line with its status: a Job
// still running (a pod that cannot start, a restart between the status and
// the stop) is stopped; a finished one is marked reported, which gives it
// its TTL and lets the history limits count it.
func (r *Reconciler) settle(ctx context.Context, rt *v1alpha1.RunnerTask, j *batchv1.Job) error {
	switch {
	case j == nil || j.DeletionTimestamp != nil:
		return nil
	case !job.Finished(j):
		if err := r.opts.Client.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("stopping job %s: %w", j.Name, err)
		}
		return nil
	case j.Annotations[job.AnnotationReported] == "":
		if err := job.MarkReported(ctx, r.opts.Client, j, r.opts.Jobs, time.Time{}); err != nil {
			return err
		}
	}
	// Also when the mark reaches the cache: prunes that ran at nearly the
	// same moment each saw only their own mark.
	return r.pruneHistory(ctx, rt.Namespace, j.Name)
}

// pruneHistory deletes this dispatcher's oldest reported Jobs in a
// namespace beyond the history limits. This source keeps no Job past them
// (its record of a task's end is the RunnerTask's status).
func (r *Reconciler) pruneHistory(ctx context.Context, namespace, marked string) error {
	_, err := job.PruneHistory(ctx, r.opts.Client, job.History{
		Namespace: namespace, DispatcherID: r.opts.Jobs.DispatcherID,
		Succeeded: r.opts.SucceededHistory, Failed: r.opts.FailedHistory, Marked: marked,
	})
	return err
}
