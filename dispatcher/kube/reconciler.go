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
	"maps"
	"sort"
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
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
	"github.com/runwarden/runwarden/internal/contract"
)

// ReasonCapacity is the reason of a task waiting for a free slot.
const ReasonCapacity = "WaitingForCapacity"

// Options configure a Reconciler.
type Options struct {
	// Options are the limits every source shares, with their defaults
	// (package runner): capacity, workers, timeouts, history, the clock.
	runner.Options
	// Client reads and writes the cluster. Required.
	Client client.Client
	// Jobs says how Jobs are built (dispatcher ID, template, allow-lists). Required.
	Jobs job.Options
	// Reader reads from the API server itself: to tell a Job the cache does
	// not show yet from one that is gone, and what is not in the
	// label-filtered cache (Warning events, Kueue Workloads). Default:
	// Client.
	Reader client.Reader
	// Recorder counts what the reconciler does. Default: none.
	Recorder runner.Recorder
	// Logs reads runner logs, to keep the end of each finished task's in a
	// ConfigMap (KeepLogBytes). Default: none, no log is kept.
	Logs runner.LogReader
	// KeepLogBytes is how much of the end of a finished task's log is kept.
	// Default (0): none.
	KeepLogBytes int
}

func (o *Options) setDefaults() {
	o.SetDefaults()
	if o.Reader == nil {
		o.Reader = o.Client
	}
	if o.Recorder == nil {
		o.Recorder = runner.NoRecorder{}
	}
}

// Reconciler runs RunnerTasks as Jobs.
type Reconciler struct {
	opts     Options
	observer job.Observer
	capacity runner.Capacity
	settler  runner.Settler
	// starting serializes the capacity check, so parallel workers never
	// start more than MaxConcurrent tasks. reserved holds the Jobs this
	// process is creating or created that the cache has not shown yet,
	// each with its RunnerTask; the creates themselves run in parallel.
	starting sync.Mutex
	reserved map[types.NamespacedName]types.NamespacedName
	// taken is the load of the unfinished Jobs the cache showed at the
	// last count: running (with Kueue: admitted) and, with Kueue, waiting
	// in Kueue (or for their Secret). Jobs only finish between counts, so
	// taken plus the reservations made since is never below the real load:
	// the cache is counted again only when that bound reaches
	// MaxConcurrent, and before the first task this process starts
	// (counted).
	taken   runner.Load
	counted bool
	// wake hands waiting RunnerTasks to the controller when a slot frees,
	// so the next in line starts at once rather than at its requeue.
	wake chan event.GenericEvent
	// indexed tells that Client's cache indexes waitingField
	// (SetupWithManager): line then lists only the tasks that may wait.
	indexed bool
	// waitingTasks counts the tasks that may wait, by namespace, so a start
	// reads the line only when it may not fit in the free slots.
	waitingTasks *waitingCount

	// marked holds the tasks whose Running status (with the Job's name)
	// this process wrote and the cache does not show yet, so a reconcile
	// of the stale copy (the Job's own event comes first) does not write
	// it again.
	markedMu sync.Mutex
	marked   map[types.NamespacedName]string

	// kept holds the log ConfigMaps this process made for finished tasks
	// whose status does not name them yet (the update failed), so the
	// next try names the same one rather than keeping the log twice.
	keptMu sync.Mutex
	kept   map[types.NamespacedName]logMade
}

var _ reconcile.Reconciler = (*Reconciler)(nil)

// New returns a Reconciler.
func New(opts Options) *Reconciler {
	opts.setDefaults()
	kueue := opts.Jobs.Queueing.Kueue
	return &Reconciler{
		opts: opts, reserved: map[types.NamespacedName]types.NamespacedName{}, marked: map[types.NamespacedName]string{},
		kept: map[types.NamespacedName]logMade{}, wake: make(chan event.GenericEvent, 1024), waitingTasks: newWaitingCount(),
		observer: runner.NewObserver(opts.Options, opts.Client, opts.Reader, kueue),
		capacity: opts.Capacity(kueue),
		settler:  runner.Settler{Client: opts.Client, Jobs: opts.Jobs, Options: opts.Options},
	}
}

// waitingField indexes the cached RunnerTasks that may wait for a slot:
// no Job in their status, unfinished, not cancelled, not being deleted.
// line reads only those, not every task of the namespace: at 1,000 tasks,
// reading all of them for every start was a million objects copied.
const waitingField = "runwarden.dev/waiting"

// mayWait is the index of waitingField: "true" for a RunnerTask that line
// may put in the waiting line (line checks again; the index only leaves
// out the tasks that cannot wait).
func mayWait(o client.Object) []string {
	t, ok := o.(*v1alpha1.RunnerTask)
	if !ok || t.Status.JobName != "" || terminal(t.Status.Phase) || t.Spec.Cancel || t.DeletionTimestamp != nil {
		return nil
	}
	return []string{"true"}
}

// SetupWithManager watches RunnerTasks, their Jobs, and the Jobs' pods.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.RunnerTask{}, waitingField, mayWait); err != nil {
		return fmt.Errorf("indexing waiting runner tasks: %w", err)
	}
	r.indexed = true
	informer, err := mgr.GetCache().GetInformer(context.Background(), &v1alpha1.RunnerTask{})
	if err != nil {
		return fmt.Errorf("watching runner tasks: %w", err)
	}
	reg, err := informer.AddEventHandler(r.waitingTasks.handler())
	if err != nil {
		return fmt.Errorf("counting waiting runner tasks: %w", err)
	}
	r.waitingTasks.synced = reg.HasSynced
	return ctrl.NewControllerManagedBy(mgr).
		Named("runnertask").
		WithOptions(controller.Options{MaxConcurrentReconciles: r.opts.Workers}).
		For(&v1alpha1.RunnerTask{}).
		Owns(&batchv1.Job{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podToTask)).
		WatchesRawSource(source.Channel(r.wake, &handler.EnqueueRequestForObject{})).
		Complete(r)
}

// podToTask maps a runner pod to its RunnerTask through the task annotation.
// A task's Job, and so its pod, is in the task's namespace: a pod whose
// annotation names another is none of the source's tasks' (the preflight's
// pod, whose ID is "preflight/<dispatcher>/<suffix>", or one planted with
// such an annotation), and is left alone rather than sending the
// reconciler to a namespace its cache may not hold, which it would retry
// with backoff for as long as the pod stays.
func podToTask(_ context.Context, o client.Object) []reconcile.Request {
	ns, name, ok := taskRef(o.GetAnnotations()[contract.TaskID])
	if !ok || ns != o.GetNamespace() {
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

// Reconcile implements reconcile.Reconciler: it brings a RunnerTask's Job
// and status one step on.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	rt, err := r.task(ctx, req.NamespacedName)
	if rt == nil || err != nil {
		return reconcile.Result{}, err
	}
	name := job.Name(TaskID(rt))
	// A RunnerTask deleted and created again under the same name is a new
	// task: the slot of the old one's Job goes.
	r.releaseTask(req.NamespacedName, name)
	j, err := r.job(ctx, rt.Namespace, name)
	switch {
	case err != nil:
		return reconcile.Result{}, err
	case terminal(rt.Status.Phase):
		return reconcile.Result{}, r.settle(ctx, j)
	case rt.Spec.Cancel:
		return reconcile.Result{}, r.cancel(ctx, rt, j)
	case j == nil && (rt.Status.JobName != "" || r.wasMarked(req.NamespacedName, name)):
		return r.missing(ctx, rt, name)
	case j == nil:
		return r.start(ctx, rt)
	case j.Annotations[contract.TaskID] != TaskID(rt):
		// The Job is the task's by what no one else can write: its name
		// (job.Name of the task ID, which holds the RunnerTask's UID) and
		// this dispatcher's label, which the chart's Jobs policy lets only
		// the dispatcher put on a Job (the cache holds no other). Its task
		// annotation is the dispatcher's too under the chart's writers
		// policy; rewritten by whoever may patch Jobs where that policy is
		// not installed, it must not end the task while its Job runs on
		// unwatched: the task is followed as if it were not.
		log.FromContext(ctx).Info("the task's Job carries another task annotation than the one the dispatcher wrote; the Job is followed as the task's by its name", "job", j.Name, "annotation", j.Annotations[contract.TaskID])
	}
	if rt.Status.JobName == "" && !r.wasMarked(req.NamespacedName, j.Name) {
		// Adopted after a restart between create and status update.
		if err := r.setStarted(ctx, rt, j.Name, r.waiting(j)); err != nil {
			return reconcile.Result{}, err
		}
	}
	return r.follow(ctx, rt, j)
}

// task reads the RunnerTask and drops what this process remembers of it
// that its status now holds; nil when it is gone.
func (r *Reconciler) task(ctx context.Context, key types.NamespacedName) (*v1alpha1.RunnerTask, error) {
	rt := &v1alpha1.RunnerTask{}
	if err := r.opts.Client.Get(ctx, key, rt); err != nil {
		if apierrors.IsNotFound(err) {
			r.forgetMarked(key)
			r.forgetKept(key)
			// Deleted: its Job goes with it (it is the owner), maybe
			// before the cache ever showed it, and then no count would
			// drop the slot it holds.
			r.releaseTask(key, "")
		}
		return nil, client.IgnoreNotFound(err)
	}
	if rt.Status.JobName != "" || terminal(rt.Status.Phase) {
		r.forgetMarked(key)
	}
	if terminal(rt.Status.Phase) {
		r.forgetKept(key)
	}
	return rt, nil
}

// job reads the task's Job from the cache; nil when the cache has none.
func (r *Reconciler) job(ctx context.Context, namespace, name string) (*batchv1.Job, error) {
	j := &batchv1.Job{}
	err := r.opts.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, j)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading job %s: %w", name, err)
	}
	return j, nil
}

// cancel ends a task whose spec asks for it: its Job is stopped, unless it
// ended before the cancellation was seen (say, while the dispatcher was
// down), which keeps its real outcome.
func (r *Reconciler) cancel(ctx context.Context, rt *v1alpha1.RunnerTask, j *batchv1.Job) error {
	if j != nil {
		out, err := r.observer.Outcome(ctx, j)
		if err != nil {
			return err
		}
		if out.Phase != "" {
			return r.finish(ctx, rt, j, out)
		}
		if err := r.opts.Client.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("stopping job %s: %w", j.Name, err)
		}
	}
	return r.finish(ctx, rt, nil, job.Outcome{Phase: job.PhaseCancelled, Reason: job.ReasonCancelled, Message: "cancelled by spec.cancel"})
}

// missing handles a task whose Job was created (its status says so, or
// this process wrote that and the cache lags) but is not in the cache:
// never create a second one. The API server tells a Job only missing from
// the cache so far, or made under another dispatcher ID, from one that is
// gone.
func (r *Reconciler) missing(ctx context.Context, rt *v1alpha1.RunnerTask, name string) (reconcile.Result, error) {
	live := &batchv1.Job{}
	switch err := r.opts.Reader.Get(ctx, client.ObjectKey{Namespace: rt.Namespace, Name: name}, live); {
	case err == nil && live.Labels[contract.LabelDispatcher] != r.opts.Jobs.DispatcherID:
		// Made under another dispatcher ID (this one's changed): the
		// cache, which holds only Jobs of this ID, would never show it.
		log.FromContext(ctx).Info("taking over a Job made under another dispatcher ID", "job", live.Name, "was", live.Labels[contract.LabelDispatcher])
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

// follow brings the status of a task whose Job exists in line with the
// Job's outcome: queued, running, or finished.
func (r *Reconciler) follow(ctx context.Context, rt *v1alpha1.RunnerTask, j *batchv1.Job) (reconcile.Result, error) {
	out, err := r.observer.Outcome(ctx, j)
	if err != nil {
		return reconcile.Result{}, err
	}
	if out.Queued {
		if rt.Status.Phase != v1alpha1.PhaseQueued || rt.Status.Message != out.Message {
			rt.Status.Phase, rt.Status.Reason, rt.Status.Message = v1alpha1.PhaseQueued, job.ReasonQueued, out.Message
			if err := r.opts.Client.Status().Update(ctx, rt); err != nil {
				return reconcile.Result{}, err
			}
		}
		// Admission and eviction change the Job, which is watched; the
		// requeue only refreshes why it waits.
		if out.Unread {
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return reconcile.Result{RequeueAfter: 6 * r.opts.RequeueAfter}, nil
	}
	if out.Phase == "" {
		if rt.Status.Phase == v1alpha1.PhaseQueued && !r.waiting(j) {
			// Admitted by Kueue.
			if err := r.setStarted(ctx, rt, j.Name, false); err != nil {
				return reconcile.Result{}, err
			}
		}
		// Still running: look again even if no watched object changes
		// (admission rejections and scheduling timeouts show in events and
		// the clock, not in the Job).
		return reconcile.Result{RequeueAfter: r.opts.RequeueAfter}, nil
	}
	return reconcile.Result{}, r.finish(ctx, rt, j, out)
}

// waiting tells whether a Job of this dispatcher's waits in Kueue (or, with
// Kueue, for its Secret): suspended and unfinished.
func (r *Reconciler) waiting(j *batchv1.Job) bool {
	return r.opts.Jobs.Queueing.Kueue && ptr.Deref(j.Spec.Suspend, false) && !job.Finished(j)
}

// start creates the task's Secret and Job, unless capacity is full.
func (r *Reconciler) start(ctx context.Context, rt *v1alpha1.RunnerTask) (reconcile.Result, error) {
	key := types.NamespacedName{Namespace: rt.Namespace, Name: job.Name(TaskID(rt))}
	ok, msg, err := r.reserve(ctx, key, rt)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !ok {
		if rt.Status.Phase != v1alpha1.PhasePending || rt.Status.Reason != ReasonCapacity || rt.Status.Message != msg {
			rt.Status.Phase, rt.Status.Reason, rt.Status.Message = v1alpha1.PhasePending, ReasonCapacity, msg
			if err := r.opts.Client.Status().Update(ctx, rt); err != nil {
				return reconcile.Result{}, err
			}
		}
		return reconcile.Result{RequeueAfter: r.opts.RequeueAfter}, nil
	}
	t := job.Task{
		ID: TaskID(rt), Namespace: rt.Namespace, Image: rt.Spec.Image, Command: rt.Spec.Command, Args: rt.Spec.Args,
		Env: rt.Spec.Env, RepoURL: rt.Spec.RepoURL, Resources: rt.Spec.Resources, ActiveDeadlineSeconds: rt.Spec.ActiveDeadlineSeconds,
		Queue: rt.Spec.Queue, PriorityClass: rt.Spec.PriorityClass,
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
	made, err := job.Create(ctx, r.opts.Client, j, secret, job.CreateOptions{SecretWait: r.opts.SecretGCWait})
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
	return reconcile.Result{}, r.setStarted(ctx, rt, j.Name, r.opts.Jobs.Queueing.Kueue)
}

// reserve takes a slot for the Job (key) of a RunnerTask about to be
// created, if one is free, and otherwise says why the task waits. Without
// Kueue, the waiting tasks take the free slots in priority, then creation,
// order: a task starts only if fewer than the free slots are ahead of it.
// With Kueue, a Job is made while fewer than MaxConcurrent of this
// dispatcher's Jobs are admitted and fewer than MaxQueued wait in Kueue;
// Kueue orders them.
func (r *Reconciler) reserve(ctx context.Context, key types.NamespacedName, rt *v1alpha1.RunnerTask) (bool, string, error) {
	r.starting.Lock()
	defer r.starting.Unlock()
	// With Kueue, Jobs are admitted between counts: count each time.
	if r.capacity.Kueue || !r.counted || r.load().Running >= r.opts.MaxConcurrent {
		if err := r.count(ctx); err != nil {
			return false, "", err
		}
	}
	load := r.load()
	if why := r.capacity.Full(load); why != "" {
		return false, why, nil
	}
	if r.capacity.Kueue {
		r.reserved[key] = client.ObjectKeyFromObject(rt)
		r.opts.Recorder.Running(load.Running)
		return true, "", nil
	}
	ahead, err := r.ahead(ctx, rt)
	if err != nil {
		return false, "", err
	}
	if load.Running+ahead >= r.opts.MaxConcurrent {
		return false, fmt.Sprintf("%d of %d tasks running; %d waiting tasks go first", load.Running, r.opts.MaxConcurrent, ahead), nil
	}
	r.reserved[key] = client.ObjectKeyFromObject(rt)
	r.opts.Recorder.Running(load.Running + 1)
	return true, "", nil
}

// load is the load of the last count and the reservations made since.
// r.starting is held.
func (r *Reconciler) load() runner.Load {
	return r.capacity.Add(r.taken, runner.Making, len(r.reserved))
}

// line is the RunnerTasks of a namespace that wait for a slot (no Job yet,
// none being made), in the order they take one: higher priority first,
// then older first (unordered when there are slots for all of them). They
// are the cache's own objects: read them, never change them. r.starting is
// held.
func (r *Reconciler) line(ctx context.Context, namespace string) ([]*v1alpha1.RunnerTask, error) {
	var tasks v1alpha1.RunnerTaskList
	// Read-only: the cache's objects are not copied.
	opts := []client.ListOption{client.InNamespace(namespace), client.UnsafeDisableDeepCopy}
	if r.indexed {
		opts = append(opts, client.MatchingFields{waitingField: "true"})
	}
	if err := r.opts.Client.List(ctx, &tasks, opts...); err != nil {
		return nil, fmt.Errorf("listing runner tasks: %w", err)
	}
	starting := map[types.NamespacedName]bool{}
	for _, t := range r.reserved {
		starting[t] = true
	}
	var line []*v1alpha1.RunnerTask
	prio := map[*v1alpha1.RunnerTask]int32{}
	for i := range tasks.Items {
		t := &tasks.Items[i]
		if t.Status.JobName != "" || terminal(t.Status.Phase) || t.Spec.Cancel || t.DeletionTimestamp != nil ||
			starting[client.ObjectKeyFromObject(t)] || r.wasMarkedTask(t) {
			continue
		}
		// A class the dispatcher does not know ranks as 0; the task is
		// refused when its turn comes.
		prio[t], _ = r.opts.Jobs.Queueing.Priority(t.Spec.PriorityClass)
		line = append(line, t)
	}
	if r.load().Running+len(line) <= r.opts.MaxConcurrent {
		// Room for every waiting task: the order does not matter.
		return line, nil
	}
	sort.SliceStable(line, func(i, j int) bool {
		a, b := line[i], line[j]
		if prio[a] != prio[b] {
			return prio[a] > prio[b]
		}
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	return line, nil
}

// ahead is how many waiting tasks go before rt. r.starting is held.
func (r *Reconciler) ahead(ctx context.Context, rt *v1alpha1.RunnerTask) (int, error) {
	if n, ok := r.waitingTasks.atMost(rt.Namespace, maps.Values(r.reserved)); ok && r.load().Running+n <= r.opts.MaxConcurrent {
		// The line is no longer than the tasks that may wait: it fits.
		return 0, nil
	}
	line, err := r.line(ctx, rt.Namespace)
	if err != nil {
		return 0, err
	}
	if r.load().Running+len(line) <= r.opts.MaxConcurrent {
		return 0, nil
	}
	for i, t := range line {
		if t.Namespace == rt.Namespace && t.Name == rt.Name {
			return i, nil
		}
	}
	// Not in the cache's line yet (just made): behind everyone.
	return len(line), nil
}

// wakeNext hands the tasks first in line for the free slots to the
// controller. r.starting is held.
func (r *Reconciler) wakeNext(ctx context.Context, namespace string) {
	if r.capacity.Kueue {
		return
	}
	free := r.capacity.Free(r.load())
	if free <= 0 {
		return
	}
	line, err := r.line(ctx, namespace)
	if err != nil {
		return // the requeue of each waiting task is the safety net
	}
	for _, t := range line[:min(free, len(line))] {
		select {
		case r.wake <- event.GenericEvent{Object: &v1alpha1.RunnerTask{ObjectMeta: metav1.ObjectMeta{Namespace: t.Namespace, Name: t.Name}}}:
		default:
		}
	}
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
	if err := r.opts.Client.List(ctx, &jobs, client.MatchingLabels{contract.LabelDispatcher: r.opts.Jobs.DispatcherID}, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing jobs: %w", err)
	}
	var taken runner.Load
	for i := range jobs.Items {
		j := &jobs.Items[i]
		delete(r.reserved, client.ObjectKeyFromObject(j))
		taken = r.capacity.Add(taken, r.capacity.JobSlot(j), 1)
	}
	r.taken, r.counted = taken, true
	r.opts.Recorder.Running(r.load().Running)
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
	if err := r.count(ctx); err != nil {
		return err
	}
	r.wakeNext(ctx, key.Namespace)
	return nil
}

func (r *Reconciler) wasMarked(key types.NamespacedName, jobName string) bool {
	r.markedMu.Lock()
	defer r.markedMu.Unlock()
	return r.marked[key] == jobName
}

// wasMarkedTask is wasMarked for a RunnerTask's own Job, whose name is
// worked out (a hash) only for the few tasks marked at all.
func (r *Reconciler) wasMarkedTask(t *v1alpha1.RunnerTask) bool {
	key := client.ObjectKeyFromObject(t)
	r.markedMu.Lock()
	name, ok := r.marked[key]
	r.markedMu.Unlock()
	return ok && name == job.Name(TaskID(t))
}

func (r *Reconciler) forgetMarked(key types.NamespacedName) {
	r.markedMu.Lock()
	delete(r.marked, key)
	r.markedMu.Unlock()
}

// setStarted records the task's Job in its status: Running, or Queued
// while the Job waits in Kueue (StartTime is set once it runs).
func (r *Reconciler) setStarted(ctx context.Context, rt *v1alpha1.RunnerTask, jobName string, queued bool) error {
	rt.Status.Phase = v1alpha1.PhaseRunning
	rt.Status.JobName = jobName
	rt.Status.Reason, rt.Status.Message = "", ""
	started := false
	if queued {
		rt.Status.Phase, rt.Status.Reason = v1alpha1.PhaseQueued, job.ReasonQueued
		rt.Status.Message = "queued in Kueue"
	} else if rt.Status.StartTime == nil {
		rt.Status.StartTime = ptr.To(metav1.NewTime(r.opts.Clock.Now()))
		started = true
	}
	if err := r.opts.Client.Status().Update(ctx, rt); err != nil {
		return err
	}
	if started {
		r.opts.Recorder.Started(rt.Status.StartTime.Sub(rt.CreationTimestamp.Time))
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
	rt.Status.CompletionTime = ptr.To(metav1.NewTime(r.opts.Clock.Now()))
	if j != nil {
		rec, err := job.ReadRecord(ctx, r.opts.Client, j)
		if err != nil {
			return err
		}
		rt.Status.Record = rec
		if rt.Status.LogConfigMap, err = r.keepLog(ctx, rt, j.Name, rec.Pod); err != nil {
			return err
		}
	}
	if err := r.opts.Client.Status().Update(ctx, rt); err != nil {
		return err
	}
	r.forgetKept(client.ObjectKeyFromObject(rt))
	// Once, when the record is written: a write that conflicts is tried
	// again and logs nothing.
	jobName := rt.Status.JobName
	if j != nil {
		jobName = j.Name
	}
	log.FromContext(ctx).Info("task finished", "job", jobName, "phase", out.Phase, "reason", out.Reason)
	r.opts.Recorder.Finished(out.Phase, out.Reason)
	if rt.Status.StartTime != nil {
		r.opts.Recorder.Ran(out.Phase, rt.Status.CompletionTime.Sub(rt.Status.StartTime.Time))
	}
	if err := r.settle(ctx, j); err != nil {
		return err
	}
	return r.recount(ctx, types.NamespacedName{Namespace: rt.Namespace, Name: job.Name(TaskID(rt))})
}

// settle brings the Job of a finished task in line with its status: a Job
// still running (a pod that cannot start, a restart between the status and
// the stop) is stopped; a finished one is marked reported, which gives it
// its TTL and lets the history limits count it.
func (r *Reconciler) settle(ctx context.Context, j *batchv1.Job) error {
	switch {
	case j == nil || j.DeletionTimestamp != nil:
		return nil
	case !job.Finished(j):
		if err := r.opts.Client.Delete(ctx, j, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("stopping job %s: %w", j.Name, err)
		}
		return nil
	}
	// Also when the mark reaches the cache: prunes that ran at nearly the
	// same moment each saw only their own mark. This source keeps no Job
	// past the history limits (its record of a task's end is the
	// RunnerTask's status), so there is nothing to prune again later.
	_, err := r.settler.Settle(ctx, j, time.Time{})
	return err
}
